"""Verbatim notes: a back end that keeps each saved turn's own text as its memory note, for every system alike.

It wraps the run's generator: condense requests (a saved turn's note) are answered with the turn's text
(`metadata["turn_text"]`, which every condense request carries) without a model call; every other request goes to
the generator unchanged. A benchmark whose turns are self-contained (LoCoMo: short turns that name their speaker)
then spends no generation on notes, which on 2 CPU cores would cost more than the rest of its run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icml_jax.llm.types import TASK_CONDENSE, LLMBackend, LLMRequest, LLMResponse, TokenUsage


class VerbatimNotes:
    """`inner` for every request but condense ones, which are answered with the saved turn's text."""

    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
        self.name = f"verbatim-notes({inner.name})"
        self.notes = 0  # condense requests answered here

    @property
    def remote(self) -> bool:
        return bool(getattr(self.inner, "remote", False))

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        out: list[LLMResponse | None] = [None] * len(requests)
        passed = []
        for i, r in enumerate(requests):
            if r.task == TASK_CONDENSE:
                text = r.metadata.get("turn_text")
                if not isinstance(text, str):
                    raise ValueError(f"{self.name}: condense request {i} carries no metadata['turn_text'] to keep")
                out[i] = LLMResponse.answering(r, text, finish_reason="verbatim")
                self.notes += 1
            else:
                passed.append(i)
        answers = self.inner.generate([requests[i] for i in passed]) if passed else []
        for i, answer in zip(passed, answers, strict=True):
            out[i] = answer
        return [a for a in out if a is not None]

    def __getattr__(self, name: str) -> Any:  # loglik, answered, ... of the wrapped back end
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def usage(self) -> TokenUsage:
        return self.inner.usage

    def close(self) -> None:
        """Nothing: the wrapped back end stays its owner's to close."""


__all__ = ["VerbatimNotes"]
