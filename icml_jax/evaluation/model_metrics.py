"""Reply metrics that need a model, loaded from local paths only (nothing is downloaded):

- BERTScore F1 (`bert-score`) with the encoder at `model_path` and its `layer`, no idf weighting, no baseline
  rescaling. The paper's English setting is bert-score's default, roberta-large at layer 17, which users put in a
  local directory by hand; the fetched all-MiniLM-L6-v2 (6 layers, 384 wide) runs at any of its layers, but its
  magnitudes are not the paper's.
- MAUVE (`mauve-text`) between the replies and the references, on features from our own Flax decoder: the final
  hidden state (after the final norm) of each text's last token, the featurization MAUVE's reference
  implementation does with GPT-2 large. GPT-2 is not one of the decoder's families: the featurizer is a local
  Llama / Qwen2 / Qwen3 / Gemma3 checkpoint (e.g. the backbone), so the magnitudes are not comparable with the
  paper's GPT-2-large MAUVE.

Both in percent, as the paper's Table 1; each score carries what computed it (`ModelScore.details`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.models import ModelConfig, ModelConfigError, from_pretrained, load_tokenizer
from icml_jax.models.config import FAMILIES
from icml_jax.models.sampler import bucket

BERTSCORE_IDF = False  # bert-score's default: every token weighs the same
BERTSCORE_RESCALE = False  # bert-score's default; its baselines exist only for its own model names anyway
MAUVE_FEATURES = "final hidden state (after the final norm) of each text's last token"


@dataclasses.dataclass(frozen=True)
class ModelScore:
    """A corpus score in percent with the model that computed it."""

    value: float
    signature: str
    count: int
    per_target: tuple[float, ...] = ()  # percent, where the metric has a per-target value (BERTScore)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # model, model_type, layer, settings


def _hf_config(path: Path, what: str) -> dict[str, Any]:
    """The `config.json` of the local model directory `path`; `what` names the metric in the errors."""
    if not path.is_dir():
        raise FileNotFoundError(f"{what}: model directory {path} does not exist (nothing is downloaded)")
    file = path / "config.json"
    try:
        hf = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: {file} does not exist (a Hugging Face model directory has one)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: {file} is not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{what}: {file} holds a {type(hf).__name__}, not a JSON object")
    return hf


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_bertscore_model(model_path: str | os.PathLike[str], layer: int) -> dict[str, Any]:
    """What BERTScore will run with (model, model_type, layer, layer count, idf, rescaling); raises when the
    directory or its config.json is missing or `layer` is not one of the model's 0..num_hidden_layers."""
    path = Path(model_path)
    try:
        hf = _hf_config(path, "BERTScore")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (e.g. roberta-large put there by hand, or all-MiniLM-L6-v2 from "
                                "`python -m icml_jax.models.fetch all-minilm-l6-v2`)") from None
    n = hf.get("num_hidden_layers")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ValueError(f"BERTScore: layer {layer!r} for {path} is not an integer (eval.bertscore_layer)")
    if isinstance(n, int) and not 0 <= layer <= n:
        raise ValueError(f"BERTScore: layer {layer} is outside 0..{n} for {path} (its config.json has "
                         f"num_hidden_layers {n}; set eval.bertscore_layer, e.g. {n}, its last)")
    return {"model": str(path), "model_type": hf.get("model_type"), "layer": layer, "num_hidden_layers": n,
            "idf": BERTSCORE_IDF, "rescale_with_baseline": BERTSCORE_RESCALE,
            "package": f"bert-score {_version('bert-score')}"}


def bertscore_f1(replies: Sequence[str], references: Sequence[str], *, model_path: str | os.PathLike[str],
                 layer: int, batch_size: int = 32) -> ModelScore:
    """Mean BERTScore F1 of each reply against its reference, in percent, through bert-score's `score` with the
    encoder at `model_path` truncated to `layer` layers (its output is hidden state `layer`; 0: the embeddings)."""
    from bert_score import score

    if len(replies) != len(references) or not replies:
        raise ValueError(f"BERTScore: {len(replies)} replies and {len(references)} references")
    details = check_bertscore_model(model_path, layer)
    path = details["model"]
    _, _, f1 = score(list(replies), list(references), model_type=path, num_layers=layer, batch_size=batch_size,
                     device="cpu", use_fast_tokenizer=True, idf=BERTSCORE_IDF,
                     rescale_with_baseline=BERTSCORE_RESCALE)
    of = f" of {details['num_hidden_layers']}" if details["num_hidden_layers"] is not None else ""
    signature = (f"bert-score F1, {os.path.basename(path.rstrip('/'))} ({details['model_type']}) layer {layer}{of}, "
                 "no idf, no rescaling")
    return ModelScore(100.0 * float(f1.mean()), signature, len(replies), tuple(100.0 * float(x) for x in f1), details)


def check_mauve_model(model_path: str | os.PathLike[str]) -> dict[str, Any]:
    """What MAUVE's features come from (model, model_type, family, hidden size, layer); raises one error naming
    the checkpoint's model_type and the decoder's families when our decoder cannot load it (GPT-2 included)."""
    path = Path(model_path)
    hf = _hf_config(path, "MAUVE featurizer")
    try:
        config = ModelConfig.from_hf(hf, source=str(path / "config.json"))
    except ModelConfigError as e:
        raise ModelConfigError(
            f"MAUVE featurizer (eval.mauve_model) {path}: model_type {hf.get('model_type')!r} cannot be loaded by "
            f"our decoder, whose families are {', '.join(FAMILIES)} ({e}). MAUVE's reference featurizer, GPT-2 "
            "large (model_type 'gpt2'), is not one of them: point eval.mauve_model at a local checkpoint of those "
            "families (e.g. the backbone); its MAUVE is not comparable with the paper's GPT-2-large figures"
        ) from None
    return {"model": str(path), "model_type": hf.get("model_type"), "family": config.family,
            "hidden_size": config.hidden_size, "layer": f"final hidden state, last token ({MAUVE_FEATURES})",
            "package": f"mauve-text {_version('mauve-text')}"}


def load_mauve_featurizer(model_path: str | os.PathLike[str]) -> tuple[Any, Any, dict[str, Any]]:
    """(decoder, tokenizer, details) of the local checkpoint whose last-token hidden states feed MAUVE, float32."""
    import jax.numpy as jnp

    details = check_mauve_model(model_path)
    return from_pretrained(model_path, dtype=jnp.float32), load_tokenizer(str(model_path)), details


def last_token_features(model, tokenizer, texts: Sequence[str], *, max_length: int = 256,
                        batch_size: int = 16) -> np.ndarray:
    """[len(texts), hidden] float32: the decoder's final hidden state at each text's last token (texts cut to
    their last `max_length` tokens; batches left-padded, which does not change a row)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, mask):
        out = nnx.merge(graphdef, state)(tokens, attention_mask=mask, compute_logits=False)
        return out.hidden[:, -1].astype(jnp.float32)

    rows = [tokenizer(t, add_special_tokens=False)["input_ids"][-max_length:] or [tokenizer.eos_token_id or 0]
            for t in texts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        length = bucket(max(len(r) for r in chunk), 16)
        n = bucket(len(chunk), 1)
        tokens = np.full((n, length), pad, np.int32)
        mask = np.zeros((n, length), bool)
        for i, r in enumerate(chunk + [chunk[-1]] * (n - len(chunk))):
            tokens[i, length - len(r):], mask[i, length - len(r):] = r, True
        out.append(np.asarray(run(state, jnp.asarray(tokens), jnp.asarray(mask)))[: len(chunk)])
    return np.concatenate(out, axis=0)


def mauve_score(reply_features: np.ndarray, reference_features: np.ndarray, *, seed: int = 25,
                featurizer: str = "", details: dict[str, Any] | None = None) -> ModelScore:
    """MAUVE between the replies' and the references' feature sets (mauve-text defaults: k-means buckets of
    n/10, scaling factor 5), in percent."""
    import mauve

    p, q = np.asarray(reply_features, np.float32), np.asarray(reference_features, np.float32)
    if p.ndim != 2 or q.ndim != 2 or p.shape[1] != q.shape[1] or len(p) < 2 or len(q) < 2:
        raise ValueError(f"MAUVE: feature sets must be [n >= 2, d] with equal d, got {p.shape} and {q.shape}")
    out = mauve.compute_mauve(p_features=p, q_features=q, seed=seed, verbose=False)
    return ModelScore(100.0 * float(out.mauve), f"mauve-text, seed {seed}, features: {featurizer or 'given'}",
                      len(p), details={**(details or {}), "seed": seed, "feature_dim": int(p.shape[1])})


__all__ = ["BERTSCORE_IDF", "BERTSCORE_RESCALE", "MAUVE_FEATURES", "ModelScore", "bertscore_f1",
           "check_bertscore_model", "check_mauve_model", "last_token_features", "load_mauve_featurizer", "mauve_score"]
