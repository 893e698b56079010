"""A tiny word-level tokenizer built with `tokenizers` and saved as a `transformers` tokenizer directory."""

from __future__ import annotations

from pathlib import Path

import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<user>", "<assistant>"]
WORDS = ("i like my dog and cat we went to the park on sunday you said your sister is a doctor what do "
         "eat for dinner tonight pasta rice fish no meat please remember that allergy peanuts weather rain sun "
         "cold warm job work office teacher plan trip paris next month hello hi how are fine thanks bye").split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<user>{% else %}<assistant>{% endif %}"
    " {{ m['content'] }} {% if m['role'] != 'user' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer(directory: Path, extra_words: tuple[str, ...] = ()) -> transformers.PreTrainedTokenizerFast:
    """Saves the tokenizer to `directory` (ids: specials 0..5, then the words and `extra_words`, sorted) and
    returns it."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS) | set(extra_words)))}
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
