"""Local back end: this project's Flax model and KV-cache sampler as a self-hosted generator or judge."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icml_jax.llm.registry import register_backend
from icml_jax.llm.types import LLMRequest, LLMResponse, TokenUsage, UsageMeter


class LocalBackend:
    """Answers requests with `icml_jax.models.generate`; prompts go through the tokenizer's chat template.

    Requests are batched by (max_output_tokens, temperature), in chunks of at most `max_batch` rows padded to a
    power of two, so memory stays bounded (a thousand condensation requests do not become one batch-1000 KV
    cache) and a run compiles one program per (batch, length) bucket. JSON-schema requests get the schema
    appended to the prompt and their answer parsed leniently.
    """

    name = "local"

    def __init__(self, model, tokenizer, *, seed: int = 0, top_p: float = 1.0, top_k: int = 0,
                 max_batch: int = 16, max_output_tokens: int | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"local back end: max_batch must be >= 1, got {max_batch}")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"local back end: max_output_tokens must be >= 1, got {max_output_tokens}")
        # a cap on every request's budget: prompts sized for Gemini (e.g. the judges' 1024 tokens, room for
        # thinking) let a small local model that never emits EOS decode that far for a 60-token JSON answer
        self._cap = max_output_tokens
        self.model, self.tokenizer = model, tokenizer
        self._seed, self._top_p, self._top_k = seed, top_p, top_k
        self._max_batch = max_batch
        self._meter = UsageMeter()
        self._calls = 0

    def _render(self, request: LLMRequest) -> str:
        prompt = request.prompt
        if request.json_schema is not None:
            import json

            prompt += "\n\nAnswer with JSON only, following this JSON schema:\n" + json.dumps(request.json_schema)
        if getattr(self.tokenizer, "chat_template", None):
            from icml_jax.models.tokenizer import apply_chat_template

            messages = ([{"role": "system", "content": request.system}] if request.system else [])
            return apply_chat_template(self.tokenizer, messages + [{"role": "user", "content": prompt}])
        return (request.system + "\n\n" if request.system else "") + prompt

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answers every request in order."""
        from icml_jax.models.sampler import generate

        out: list[LLMResponse | None] = [None] * len(requests)
        groups: dict[tuple[int, float], list[int]] = {}
        for i, r in enumerate(requests):
            budget = r.max_output_tokens if self._cap is None else min(r.max_output_tokens, self._cap)
            groups.setdefault((budget, r.temperature), []).append(i)
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        chunks = [(key, idx[i:i + self._max_batch]) for key, idx in groups.items()
                  for i in range(0, len(idx), self._max_batch)]
        for (max_tokens, temperature), idx in chunks:
            prompts = [self._render(requests[i]) for i in idx]
            padded = prompts + [prompts[-1]] * (_pow2(len(prompts)) - len(prompts))  # extra rows are dropped
            start = time.perf_counter()
            self._calls += 1
            texts = generate(self.model, self.tokenizer, padded, max_new_tokens=max_tokens,
                             temperature=temperature, top_k=self._top_k, top_p=self._top_p,
                             seed=self._seed + self._calls, add_special_tokens=not templated)[: len(prompts)]
            latency = (time.perf_counter() - start) / len(idx)
            for i, prompt, text in zip(idx, prompts, texts):
                n_in = len(self.tokenizer(prompt, add_special_tokens=not templated)["input_ids"])
                n_out = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                self._meter.add(prompt_tokens=n_in, output_tokens=n_out, calls=1, attempts=1)
                out[i] = LLMResponse.answering(requests[i], text, prompt_tokens=n_in, output_tokens=n_out,
                                               latency_s=latency)
        return [r for r in out if r is not None]

    @property
    def usage(self) -> TokenUsage:
        return self._meter.usage

    def close(self) -> None:
        """Nothing to release: the model lives as long as its owner keeps it."""


def _pow2(n: int) -> int:
    """The smallest power of two >= n: the batch buckets of one generate call."""
    return 1 << max(0, n - 1).bit_length()


LOCAL_OPTIONS = ("model_dir", "tokenizer_dir", "dtype", "seed", "top_p", "top_k", "max_batch", "max_output_tokens")


def _check_local(values: Mapping[str, Any]) -> None:
    """The local block's keys and its model directory (config.json there), before any weight is read."""
    unknown = sorted(set(values) - {"kind", *LOCAL_OPTIONS})
    if unknown:
        raise ValueError(f"local back end: unknown config key(s) {unknown}; known: {sorted(LOCAL_OPTIONS)}")
    model_dir = values.get("model_dir")
    if not model_dir:
        raise ValueError("local back end needs model_dir (a local Hugging Face model directory)")
    if not (Path(model_dir).expanduser() / "config.json").is_file():
        raise ValueError(f"local back end: model_dir={model_dir!r} has no config.json (a local Hugging Face model "
                         "directory; nothing is downloaded)")


def _local(values: Mapping[str, Any]) -> LocalBackend:
    """`{'kind': 'local', 'model_dir': ..., 'tokenizer_dir': ... (default model_dir), 'dtype': 'bfloat16',
    'max_batch': 16, 'max_output_tokens': None (a cap on every request's token budget)}`."""
    import jax.numpy as jnp

    from icml_jax.models import from_pretrained, load_tokenizer

    _check_local(values)
    model = from_pretrained(values["model_dir"], dtype=jnp.dtype(values.get("dtype", "bfloat16")))
    tokenizer = load_tokenizer(values.get("tokenizer_dir") or values["model_dir"])
    return LocalBackend(model, tokenizer, seed=int(values.get("seed", 0)), top_p=float(values.get("top_p", 1.0)),
                        top_k=int(values.get("top_k", 0)), max_batch=int(values.get("max_batch", 16)),
                        max_output_tokens=(None if values.get("max_output_tokens") is None
                                           else int(values["max_output_tokens"])))


register_backend("local", _local, LOCAL_OPTIONS, check=_check_local)
