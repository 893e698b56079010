"""Local Hugging Face tokenizers and chat templates; nothing is ever downloaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import transformers


def load_tokenizer(path: str | Path) -> transformers.PreTrainedTokenizerBase:
    """Loads the tokenizer saved in a local directory (tokenizer.json / tokenizer_config.json)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {path}: {e}") from e
    tokenizer.padding_side = "left"  # generation pads on the left
    return tokenizer


def apply_chat_template(
    tokenizer: transformers.PreTrainedTokenizerBase,
    messages: Sequence[dict[str, str]],
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Renders [{"role", "content"}...] with the tokenizer's chat template, ready for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
