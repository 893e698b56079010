"""A word-level tokenizer covering the persona world's language, and a tiny backbone sized to it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import transformers
from flax import nnx
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from icml_jax.data import persona_world as pw
from icml_jax.models import Decoder, ModelConfig
from tests.models import hf_fixtures as F

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Words of the observation templates (icml_jax.agents.observation) and the speaker labels.
FRAME = "user assistant memory save this turn to long-term long term use for the reply none ( ) ? : - ."


def world_words() -> list[str]:
    """Every word (lower case, punctuation split as the pre-tokenizer does) the persona world can say."""
    texts = [FRAME, *pw.NOISE_REPLIES, *pw.FACT_REPLIES, *(t for ts in pw.NOISE.values() for t in ts)]
    for tpl in pw.TEMPLATES.values():
        texts += list(tpl.values) + list(tpl.statements) + list(tpl.updates)
        texts += [q for pair in tpl.queries for q in pair]
    words = set()
    for text in texts:
        text = text.replace("{v}", " ").replace("{old}", " ").replace("{new}", " ")
        words.update(w for w in re.findall(r"\w+|[^\w\s]", text.lower()))
    return sorted(words)


def build_world_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    """Saves a lower-casing word-level tokenizer of the world's words to `directory` and returns it."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + world_words())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                               pad_token="<pad>", unk_token="<unk>")
    tok.save_pretrained(directory)
    return tok


def world_backbone(vocab_size: int, seed: int = 0, layers: int = 2) -> Decoder:
    """A tiny random Qwen3-style decoder with `vocab_size` rows."""
    hf = json.loads(F.CONFIGS["qwen3"]().to_json_string())
    hf.update(vocab_size=vocab_size, num_hidden_layers=layers)
    hf.pop("layer_types", None)
    return Decoder(ModelConfig.from_hf(hf), rngs=nnx.Rngs(seed))
