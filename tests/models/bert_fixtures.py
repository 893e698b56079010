"""A tiny random BERT sentence encoder directory: `BertModel.save_pretrained`, a WordPiece tokenizer built with
`tokenizers`, and sentence-transformers' modules.json / 1_Pooling / sentence_bert_config.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("i like my dog and cat we went to the park on sunday you said your sister is a doctor what do eat for "
         "dinner tonight pasta rice fish no meat please remember that allergy peanuts weather rain sun cold warm "
         "job work office teacher plan trip paris next month hello hi how are fine thanks bye . , ? !").split()
PIECES = ["##s", "##ed", "##ing", "##ly"]
TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)


def build_tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    """A lower-casing WordPiece tokenizer with BERT's [CLS] text [SEP] template, saved to `directory`."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)) + PIECES)}
    core = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    core.decoder = decoders.WordPiece()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                                               cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tok.save_pretrained(directory)
    return tok


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that a layout or math error shows: LayerNorms near 1 / 0, the rest ~ 1/sqrt(fan-in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def write_sentence_files(directory: Path, *, hidden: int, pooling: str = "mean", normalize: bool = True,
                         max_seq_length: int | None = 32) -> None:
    """sentence-transformers' files: modules.json (Transformer, Pooling[, Normalize]), the pooling config and
    sentence_bert_config.json, as all-MiniLM-L6-v2 ships them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens",
             "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens"}
    config = {"word_embedding_dimension": hidden, **{flag: mode == pooling for mode, flag in flags.items()}}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2))
    if max_seq_length is not None:
        (directory / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))


def build(directory: Path, seed: int = 0, *, model_class=transformers.BertModel, sentence: bool = True,
          **sentence_kwargs) -> torch.nn.Module:
    """Saves a tiny random BERT (tokenizer and, with `sentence`, sentence-transformers files) to `directory`;
    returns the torch model (eval mode, float32)."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(directory)
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tok), **TINY)
    model = model_class(config).float().eval()
    randomize_(model, seed)
    model.save_pretrained(directory)
    if sentence:
        write_sentence_files(directory, hidden=TINY["hidden_size"], **sentence_kwargs)
    return model
