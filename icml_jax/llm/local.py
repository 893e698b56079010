"""Local back end: this project's Flax model and KV-cache sampler as a self-hosted generator or judge."""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from icml_jax.llm.registry import register_backend
from icml_jax.llm.types import (
    JUDGE_MODE_SCORES,
    JUDGE_MODES,
    SCORE_LEVELS,
    LLMRequest,
    LLMResponse,
    LoglikRequest,
    LoglikResponse,
    ScoreRequest,
    ScoreResponse,
    TokenUsage,
    UsageMeter,
)

DEFAULT_JUDGE_MODE = JUDGE_MODE_SCORES  # local judges read score-token probabilities: a verdict every time
# rows x padded length squared per forward pass (its attention scores per head): 16 rows up to 1,024 tokens, 4 of
# 2,048, 1 of 4,096; SmolLM2's 16 x 4,096-token LoCoMo prompts asked XLA for 29.7 GB in one prefill
DEFAULT_BATCH_CELLS = 16 * 1024 * 1024


class LocalBackend:
    """Answers requests with `icml_jax.models.generate`; prompts go through the tokenizer's chat template.

    Requests are batched by (max_output_tokens, temperature), in chunks of at most `max_batch` rows padded to a
    power of two and at most `max_batch_cells` attention scores per head (rows x padded length squared: long
    prompts run in fewer rows instead of out of memory), so memory stays bounded (a thousand condensation requests
    do not become one batch-1000 KV cache) and a run compiles one program per (batch, length) bucket.
    JSON-schema requests get the schema appended to the prompt and their answer parsed leniently. A sampled answer
    (temperature > 0) is seeded by the back end's seed and the request, so it is the same in any batch, order or
    run.

    `judge_mode` "scores" (the default) makes the proxy and quality judges call `score` instead of parsing JSON:
    one forward pass per (prompt, cue) reads the next-token distribution over "1".."5", so a small model that
    cannot write valid JSON still gives a verdict; "json" keeps them on `generate`.
    """

    name = "local"

    def __init__(self, model, tokenizer, *, seed: int = 0, top_p: float = 1.0, top_k: int = 0,
                 max_batch: int = 16, max_batch_cells: int = DEFAULT_BATCH_CELLS,
                 max_output_tokens: int | None = None, judge_mode: str = DEFAULT_JUDGE_MODE) -> None:
        if judge_mode not in JUDGE_MODES:
            raise ValueError(f"local back end: judge_mode must be one of {list(JUDGE_MODES)}, got {judge_mode!r}")
        self.judge_mode = judge_mode
        if max_batch < 1 or max_batch_cells < 1:
            raise ValueError(f"local back end: max_batch and max_batch_cells must be >= 1, got {max_batch}, "
                             f"{max_batch_cells}")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"local back end: max_output_tokens must be >= 1, got {max_output_tokens}")
        # a cap on every request's budget: prompts sized for Gemini (e.g. the judges' 1024 tokens, room for
        # thinking) let a small local model that never emits EOS decode that far for a 60-token JSON answer
        self._cap = max_output_tokens
        self.model, self.tokenizer = model, tokenizer
        self._seed, self._top_p, self._top_k = seed, top_p, top_k
        self._max_batch, self._max_cells = max_batch, max_batch_cells
        self._meter = UsageMeter()
        self._levels: ScoreTokens | None = None

    def _render(self, request: LLMRequest) -> str:
        prompt = request.prompt
        if request.json_schema is not None:
            prompt += "\n\nAnswer with JSON only, following this JSON schema:\n" + json.dumps(request.json_schema)
        if getattr(self.tokenizer, "chat_template", None):
            # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
            from icml_jax.models.tokenizer import apply_chat_template

            messages = ([{"role": "system", "content": request.system}] if request.system else [])
            return apply_chat_template(self.tokenizer, messages + [{"role": "user", "content": prompt}])
        return (request.system + "\n\n" if request.system else "") + prompt

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answers every request in order."""
        # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
        from icml_jax.models.sampler import generate

        out: list[LLMResponse | None] = [None] * len(requests)
        groups: dict[tuple[int, float], list[int]] = {}
        for i, r in enumerate(requests):
            budget = r.max_output_tokens if self._cap is None else min(r.max_output_tokens, self._cap)
            groups.setdefault((budget, r.temperature), []).append(i)
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        rendered = [self._render(r) for r in requests]
        lengths = [len(self.tokenizer(p, add_special_tokens=not templated)["input_ids"]) for p in rendered]
        self._check_window(requests, lengths)
        chunks = [(key, chunk) for key, idx in groups.items() for chunk in self._chunks(idx, lengths)]
        for (max_tokens, temperature), idx in chunks:
            prompts = [rendered[i] for i in idx]
            extra = _pow2(len(prompts)) - len(prompts)  # rows repeating the last prompt, their answers dropped
            padded = prompts + [prompts[-1]] * extra
            seeds = [self._sample_seed(p, max_tokens, temperature) for p in prompts]
            seeds += [seeds[-1]] * extra
            start = time.perf_counter()
            texts = generate(self.model, self.tokenizer, padded, max_new_tokens=max_tokens,
                             temperature=temperature, top_k=self._top_k, top_p=self._top_p,
                             seed=seeds, add_special_tokens=not templated)[: len(prompts)]
            latency = (time.perf_counter() - start) / len(idx)
            for i, text in zip(idx, texts):
                n_in = lengths[i]
                n_out = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                self._meter.add(prompt_tokens=n_in, output_tokens=n_out, calls=1, attempts=1)
                out[i] = LLMResponse.answering(requests[i], text, prompt_tokens=n_in, output_tokens=n_out,
                                               latency_s=latency)
        return [r for r in out if r is not None]

    def _check_window(self, requests: Sequence[LLMRequest], lengths: Sequence[int]) -> None:
        """Refuse, before any work, a request whose prompt fills the model's window: past it the positions are
        untrained and the attention of that one row alone can exhaust memory (a server refuses it too)."""
        window = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        if window is None:
            return
        for i, n in enumerate(lengths):
            if n >= window:
                raise ValueError(f"local back end: request {i} (task {requests[i].task!r}) has {n} prompt "
                                 f"tokens, at or beyond the model's {window}-token window (max_position_embeddings); "
                                 "shorten what the prompt lists")

    def _sample_seed(self, prompt: str, max_tokens: int, temperature: float) -> int:
        """A request's sampling seed (uint32): the back end's seed and what the model is given, hashed, so an
        answer depends on its request alone, not on the requests before or beside it (as the answer cache
        assumes)."""
        blob = json.dumps([self._seed, prompt, max_tokens, temperature, self._top_k, self._top_p])
        return int.from_bytes(hashlib.sha256(blob.encode("utf-8")).digest()[:4], "little")

    def _level_ids(self) -> ScoreTokens:
        """The tokenizer's score tokens, found once."""
        if self._levels is None:
            self._levels = score_token_ids(self.tokenizer)
        return self._levels

    def _render_cue(self, request: LLMRequest, cue: str) -> str:
        """The judge prompt with `cue` starting the assistant's answer (a trailing space where digits follow one)."""
        head = self._render(request) + ("" if getattr(self.tokenizer, "chat_template", None) else "\n\n")
        return head + cue + (" " if self._level_ids().trailing_space else "")

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResponse]:
        """For every request and cue, the distribution over the levels 1..5 of the next token, its expected level
        and the mass it had before normalising. A request with several cues runs the prompt they share once into
        a KV cache and only each cue's own tokens against it (`_score_shared`: the same causal computation); the
        others run row by row (`_score_rows`). Batches are padded to powers of two in rows and length, so a run
        compiles one program per bucket."""
        levels = self._level_ids()
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        rows = [(i, c, list(self.tokenizer(self._render_cue(r.request, cue), add_special_tokens=not templated)
                            ["input_ids"]))
                for i, r in enumerate(requests) for c, cue in enumerate(r.cues)]
        probs = np.zeros((len(rows), len(SCORE_LEVELS)), np.float64)
        mass = np.zeros(len(rows), np.float64)
        first_row = np.cumsum([0] + [len(r.cues) for r in requests])
        shared: list[tuple[int, int]] = []  # (request, prefix length) of the requests run on a shared prefix
        alone: list[int] = []
        for i, r in enumerate(requests):
            tokens = [rows[k][2] for k in range(first_row[i], first_row[i + 1])]
            k = _shared_length(tokens)
            if len(tokens) > 1 and k > 0:
                shared.append((i, k))
            else:
                alone.extend(range(first_row[i], first_row[i + 1]))
        start = time.perf_counter()
        self._score_rows([rows[k][2] for k in alone], alone, probs, mass, levels)
        self._score_shared(shared, rows, first_row, probs, mass, levels)
        latency = (time.perf_counter() - start) / max(1, len(requests))
        bad = [k for k in range(len(rows)) if not np.all(np.isfinite(probs[k]))]
        if bad:
            i, c, _ = rows[bad[0]]
            raise FloatingPointError(f"local back end: non-finite score-token probabilities for request {i} "
                                     f"(task {requests[i].request.task!r}), cue {requests[i].cues[c]!r}")
        levels = np.asarray(SCORE_LEVELS, np.float64)
        out, k = [], 0
        for r in requests:
            n = len(r.cues)
            p, m = probs[k:k + n], mass[k:k + n]
            n_in = sum(len(rows[j][2]) for j in range(k, k + n))
            k += n
            self._meter.add(prompt_tokens=n_in, calls=1, attempts=1)
            out.append(ScoreResponse(probs=tuple(tuple(float(x) for x in row) for row in p),
                                     expected=tuple(float(x) for x in p @ levels), mass=tuple(float(x) for x in m),
                                     prompt_tokens=n_in, latency_s=latency))
        return out

    def _score_rows(self, tokens: list[list[int]], where: list[int], probs: np.ndarray, mass: np.ndarray,
                    levels: ScoreTokens) -> None:
        """Scores whole rows (each a prompt and its cue), sorted by length and chunked to `max_batch`; writes the
        results to probs[where[j]], mass[where[j]]."""
        from flax import nnx

        # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
        from icml_jax.models.sampler import length_bucket, pad_left

        graphdef, state = nnx.split(self.model)
        order = sorted(range(len(tokens)), key=lambda j: len(tokens[j]))
        for chunk in self._chunks(order, [len(t) for t in tokens]):
            chunk = chunk + [chunk[-1]] * (_pow2(len(chunk)) - len(chunk))  # extra rows are dropped
            ids, valid = pad_left([tokens[j] for j in chunk], length_bucket(max(len(tokens[j]) for j in chunk)),
                                  self._pad_id())
            p, m = _score_program()(graphdef, state, ids, valid, levels.ids, levels.mask)
            rows = [where[j] for j in chunk]
            probs[rows], mass[rows] = np.asarray(p, np.float64), np.asarray(m, np.float64)

    def _score_shared(self, shared: list[tuple[int, int]], rows: list, first_row: np.ndarray, probs: np.ndarray,
                      mass: np.ndarray, levels: ScoreTokens) -> None:
        """Scores requests with several cues: per request the cues' common token prefix (k tokens, left-padded)
        in one pass, then every cue's remaining tokens (right-padded after it) against its cache. Requests are
        sorted by prefix length and chunked so that at most `max_batch` cue rows (at least one request) run
        together."""
        from flax import nnx

        # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
        from icml_jax.models.sampler import bucket, pad_left

        if not shared:
            return
        graphdef, state = nnx.split(self.model)
        pad = self._pad_id()
        shared = sorted(shared, key=lambda item: item[1])
        cues = max(int(first_row[i + 1] - first_row[i]) for i, _ in shared)
        per_chunk = max(1, self._max_batch // cues)
        for lo in range(0, len(shared), per_chunk):
            chunk = shared[lo:lo + per_chunk]
            chunk = chunk + [chunk[-1]] * (_pow2(len(chunk)) - len(chunk))  # extra requests are dropped
            prefixes = [rows[first_row[i]][2][:k] for i, k in chunk]
            suffixes = [[rows[r][2][k:] for r in range(first_row[i], first_row[i + 1])] for i, k in chunk]
            suffixes = [s + [s[-1]] * (cues - len(s)) for s in suffixes]  # extra cues are dropped
            prefix, prefix_valid = pad_left(prefixes, bucket(max(len(p) for p in prefixes)), pad)
            slots = bucket(max(len(x) for s in suffixes for x in s), minimum=8)
            suffix = np.full((len(chunk), cues, slots), pad, np.int32)
            suffix_valid = np.zeros((len(chunk), cues, slots), bool)
            for b, s in enumerate(suffixes):
                for c, x in enumerate(s):
                    suffix[b, c, :len(x)], suffix_valid[b, c, :len(x)] = x, True
            p, m = _shared_prefix_score_program()(graphdef, state, prefix, prefix_valid, suffix, suffix_valid,
                                                  levels.ids, levels.mask)
            p, m = np.asarray(p, np.float64), np.asarray(m, np.float64)
            for b, (i, _) in enumerate(chunk):
                n = int(first_row[i + 1] - first_row[i])
                probs[first_row[i]:first_row[i + 1]], mass[first_row[i]:first_row[i + 1]] = p[b, :n], m[b, :n]

    def loglik(self, requests: Sequence[LoglikRequest]) -> list[LoglikResponse]:
        """Each continuation's teacher-forced log-probability after its chat-templated prompt (the assistant's
        turn opened, as `generate` renders it): prompt and continuation tokenized apart and joined, so the
        continuation's tokens are the ones scored. Rows are sorted by length, chunked to `max_batch` (rows
        padded to a power of two) and left-padded to a length bucket; only the last `bucket(longest
        continuation)` positions reach the vocabulary projection."""
        from flax import nnx

        # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
        from icml_jax.models.sampler import bucket, length_bucket, pad_left

        if not requests:
            return []
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        prompts = [list(self.tokenizer(self._render(r.request), add_special_tokens=not templated)["input_ids"])
                   for r in requests]
        conts = [list(self.tokenizer(r.continuation, add_special_tokens=False)["input_ids"]) for r in requests]
        if not all(prompts):
            raise ValueError(f"local back end: loglik request {prompts.index([])} renders to no prompt token, so "
                             "its continuation's first token has nothing to be predicted from")
        sums = np.zeros(len(requests), np.float64)
        graphdef, state = nnx.split(self.model)
        order = sorted((i for i in range(len(requests)) if conts[i]), key=lambda i: len(prompts[i]) + len(conts[i]))
        for chunk in self._chunks(order, [len(p) + len(c) for p, c in zip(prompts, conts)]):
            chunk = chunk + [chunk[-1]] * (_pow2(len(chunk)) - len(chunk))  # extra rows repeat the last
            rows = [prompts[i] + conts[i] for i in chunk]
            span = bucket(max(len(conts[i]) for i in chunk), minimum=8)
            ids, valid = pad_left(rows, length_bucket(max(span + 1, max(len(r) for r in rows))), self._pad_id())
            logp = np.asarray(_loglik_program()(graphdef, state, ids, valid, span=span), np.float64)
            for b, i in enumerate(chunk):
                sums[i] = logp[b, span - len(conts[i]):].sum()
        bad = [i for i in order if not np.isfinite(sums[i])]
        if bad:
            raise FloatingPointError(f"local back end: non-finite log-likelihood for request {bad[0]} "
                                     f"(task {requests[bad[0]].request.task!r})")
        self._meter.add(prompt_tokens=sum(len(p) + len(c) for p, c in zip(prompts, conts)), calls=len(requests),
                        attempts=len(requests))
        return [LoglikResponse(logprob=float(sums[i]), tokens=len(conts[i]), prompt_tokens=len(prompts[i]))
                for i in range(len(requests))]

    def _chunks(self, order: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        """`order` cut into consecutive chunks of at most `max_batch` rows whose padded size, rows (to a power of
        two) x length bucket squared, stays within `max_batch_cells` (a row alone always runs)."""
        # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
        from icml_jax.models.sampler import length_bucket

        chunks: list[list[int]] = []
        for i in order:
            trial = (chunks[-1] if chunks else []) + [i]
            size = length_bucket(max(lengths[j] for j in trial))
            fits = len(trial) <= self._max_batch and _pow2(len(trial)) * size * size <= self._max_cells
            if len(trial) > 1 and fits:
                chunks[-1] = trial
            else:
                chunks.append([i])
        return chunks

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @property
    def usage(self) -> TokenUsage:
        return self._meter.usage

    def close(self) -> None:
        """Nothing to release: the model lives as long as its owner keeps it."""


class ScoreTokens(NamedTuple):
    """The token ids of the levels "1".."5" ([levels, variants], `mask` marks real ones) and whether a cue ends
    with a space (tokenizers that write " 4" as a space token then "4")."""

    ids: np.ndarray
    mask: np.ndarray
    trailing_space: bool


def score_token_ids(tokenizer) -> ScoreTokens:
    """Each level's token ids: the bare digit, plus a single-token " 4" variant where the tokenizer has one. With
    tokenizers that write " 4" as a space token then "4" (SmolLM2, Gemma) the space belongs to the cue and the
    next token is the bare digit. Raises when a digit is not one token (no score-token judging possible)."""
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    ids, spaced = [], []
    for level in SCORE_LEVELS:
        bare, space = encode(str(level)), encode(f" {level}")
        if len(bare) != 1:
            raise ValueError(f"local back end: cannot judge by score tokens with tokenizer "
                             f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r}: {str(level)!r} is "
                             f"not one token ({bare})")
        ids.append(sorted({t[0] for t in (bare, space) if len(t) == 1}))
        spaced.append(len(space) == 2 and space[1] == bare[0])
    width = max(len(x) for x in ids)
    table = np.array([x + [x[0]] * (width - len(x)) for x in ids], np.int32)
    mask = np.array([[j < len(x) for j in range(width)] for x in ids], bool)
    return ScoreTokens(table, mask, all(spaced))


@functools.cache
def _score_program():
    """The jitted score-token forward (built on first use, so importing this module does not import JAX)."""
    import jax
    from flax import nnx

    def score_next_token(graphdef, state, tokens, valid, level_ids, level_mask):
        """Next-token probabilities after each left-padded row [batch, length], summed over each level's token
        ids ([levels, variants], masked) and normalised over the levels; also the mass on the level tokens."""
        model = nnx.merge(graphdef, state)
        hidden = model(tokens, attention_mask=valid, compute_logits=False).hidden[:, -1]
        return _level_probs(model, hidden, level_ids, level_mask)

    return jax.jit(score_next_token, static_argnames=("graphdef",))


@functools.cache
def _shared_prefix_score_program():
    """The jitted score-token pass over prompts shared by several cues: prefix [B, L] (left-padded) once into a KV
    cache, then the cues [B, C, S] (right-padded, contiguous after the prefix) against B x C copies of it."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
    from icml_jax.models.decoder import init_cache, repeat_cache, unstack_cache

    def score_after_prefix(graphdef, state, prefix, prefix_valid, suffix, suffix_valid, level_ids, level_mask):
        model = nnx.merge(graphdef, state)
        b, c, slots = suffix.shape
        # both passes run the layers unrolled on an unstacked cache, as the sampler's decode does: under the layer
        # scan XLA:CPU copies the stacked cache at every layer (docs/benchmarks.md)
        layers = model.unstacked_layers()
        cache = unstack_cache(init_cache(model.config, b, prefix.shape[1] + slots, model.dtype))
        cache = model(prefix, attention_mask=prefix_valid, cache=cache, layers=layers, compute_logits=False).cache
        valid = suffix_valid.reshape(b * c, slots)
        hidden = model(suffix.reshape(b * c, slots), attention_mask=valid, cache=repeat_cache(cache, c),
                       layers=layers, compute_logits=False).hidden
        last = jnp.take_along_axis(hidden, (jnp.sum(valid, axis=-1) - 1)[:, None, None], axis=1)[:, 0]
        probs, mass = _level_probs(model, last, level_ids, level_mask)
        return probs.reshape(b, c, -1), mass.reshape(b, c)

    return jax.jit(score_after_prefix, static_argnames=("graphdef",))


@functools.cache
def _loglik_program():
    """The jitted teacher-forced pass: log-probabilities [rows, span] of each row's last `span` tokens."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def continuation_logprobs(graphdef, state, tokens, valid, span):
        model = nnx.merge(graphdef, state)
        hidden = model(tokens, attention_mask=valid, compute_logits=False).hidden[:, -span - 1:-1]
        logp = jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp, tokens[:, -span:, None], axis=-1)[..., 0]

    return jax.jit(continuation_logprobs, static_argnames=("graphdef", "span"))


def _level_probs(model, hidden, level_ids, level_mask):
    """From last hidden states [rows, embed]: the next token's probabilities summed over each level's token ids
    ([levels, variants], masked) and normalised over the levels, and the mass on the level tokens."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), axis=-1)  # [rows, vocab]
    per_id = jnp.where(level_mask[None], jnp.take(logp, level_ids, axis=1), -jnp.inf)  # [rows, levels, variants]
    per_level = jax.nn.logsumexp(per_id, axis=-1)
    return jax.nn.softmax(per_level, axis=-1), jnp.exp(jax.nn.logsumexp(per_level, axis=-1))


def _shared_length(rows: list[list[int]]) -> int:
    """The length of the token prefix common to `rows`, leaving every row at least one token of its own."""
    k = min(len(r) for r in rows) - 1
    for j in range(max(k, 0)):
        if any(r[j] != rows[0][j] for r in rows[1:]):
            return j
    return max(k, 0)


def _pow2(n: int) -> int:
    """The smallest power of two >= n: the batch buckets of one generate call."""
    return 1 << max(0, n - 1).bit_length()


LOCAL_OPTIONS = ("model_dir", "tokenizer_dir", "dtype", "seed", "top_p", "top_k", "max_batch", "max_batch_cells",
                 "max_output_tokens", "judge_mode")


def _check_local(values: Mapping[str, Any]) -> None:
    """The local block's keys and its model directory (config.json there), before any weight is read."""
    unknown = sorted(set(values) - {"kind", *LOCAL_OPTIONS})
    if unknown:
        raise ValueError(f"local back end: unknown config key(s) {unknown}; known: {sorted(LOCAL_OPTIONS)}")
    mode = values.get("judge_mode")
    if mode is not None and mode not in JUDGE_MODES:
        raise ValueError(f"local back end: judge_mode must be one of {list(JUDGE_MODES)}, got {mode!r}")
    model_dir = values.get("model_dir")
    if not model_dir:
        raise ValueError("local back end needs model_dir (a local Hugging Face model directory)")
    if not (Path(model_dir).expanduser() / "config.json").is_file():
        raise ValueError(f"local back end: model_dir={model_dir!r} has no config.json (a local Hugging Face model "
                         "directory; nothing is downloaded)")


def _local(values: Mapping[str, Any]) -> LocalBackend:
    """`{'kind': 'local', 'model_dir': ..., 'tokenizer_dir': ... (default model_dir), 'dtype': 'bfloat16',
    'max_batch': 16, 'max_batch_cells': 16 x 1024 x 1024 (rows x padded length squared per forward pass),
    'max_output_tokens': None (a cap on every request's token budget), 'judge_mode': 'scores' (judges read
    score-token probabilities; 'json': they parse generated JSON)}`."""
    import jax.numpy as jnp

    # local: icml_jax.models (flax, transformers) stays off `import icml_jax.llm`
    from icml_jax.models import from_pretrained, load_tokenizer

    _check_local(values)
    model = from_pretrained(values["model_dir"], dtype=jnp.dtype(values.get("dtype", "bfloat16")))
    tokenizer = load_tokenizer(values.get("tokenizer_dir") or values["model_dir"])
    return LocalBackend(model, tokenizer, seed=int(values.get("seed", 0)), top_p=float(values.get("top_p", 1.0)),
                        top_k=int(values.get("top_k", 0)), max_batch=int(values.get("max_batch", 16)),
                        max_batch_cells=int(values.get("max_batch_cells", DEFAULT_BATCH_CELLS)),
                        max_output_tokens=(None if values.get("max_output_tokens") is None
                                           else int(values["max_output_tokens"])),
                        judge_mode=values.get("judge_mode") or DEFAULT_JUDGE_MODE)


register_backend("local", _local, LOCAL_OPTIONS, check=_check_local)
