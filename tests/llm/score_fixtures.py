"""A tiny word-level tokenizer that also knows the digits 1-5 (score-token judging), saved as a HF directory."""

from __future__ import annotations

from pathlib import Path

import transformers

from tests.models.tokenizer_fixtures import build_tokenizer

DIGITS = ("1", "2", "3", "4", "5")
JUDGE_WORDS = ("score", "information", "value", "engagingness", "humanness", "coherence", "consistency",
               "memorability", "rate", "reply", "user", "assistant", "memory")


def build_digit_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    """Saves the tokenizer to `directory` (specials 0..5, then digits and words; under 97 ids) and returns it."""
    tok = build_tokenizer(directory, DIGITS + JUDGE_WORDS)
    assert len(tok) <= 97, len(tok)  # the tiny decoders' vocabulary
    return tok
