"""A tiny word-level tokenizer that also knows the digits 1-5 (score-token judging), saved as a HF directory."""

from __future__ import annotations

from pathlib import Path

import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tests.models.tokenizer_fixtures import CHAT_TEMPLATE, SPECIALS, WORDS

DIGITS = ("1", "2", "3", "4", "5")
JUDGE_WORDS = ("score", "information", "value", "engagingness", "humanness", "coherence", "consistency",
               "memorability", "rate", "reply", "user", "assistant", "memory")


def build_digit_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    """Saves the tokenizer to `directory` (specials 0..5, then digits and words; under 97 ids) and returns it."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS) | set(DIGITS) | set(JUDGE_WORDS)))}
    assert len(vocab) <= 97, len(vocab)  # the tiny decoders' vocabulary
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<user>", "<assistant>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(directory)
    return tok
