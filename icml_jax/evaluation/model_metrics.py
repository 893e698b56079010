"""Reply metrics that need a model, loaded from local paths only (nothing is downloaded):

- BERTScore F1 (`bert-score`) with the encoder at `model_path` and its `layer`; the paper's English setting is
  bert-score's default, roberta-large at layer 17, which users put in a local directory by hand.
- MAUVE (`mauve-text`) between the replies and the references, on features from our own Flax decoder: the final
  hidden state of each text's last token (the featurization MAUVE's reference implementation does with GPT-2),
  from any local Hugging Face checkpoint `icml_jax.models.from_pretrained` loads.

Both in percent, as the paper's Table 1.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelScore:
    """A corpus score in percent with the model that computed it."""

    value: float
    signature: str
    count: int
    per_target: tuple[float, ...] = ()  # percent, where the metric has a per-target value (BERTScore)


def bertscore_f1(replies: Sequence[str], references: Sequence[str], *, model_path: str | os.PathLike[str],
                 layer: int, batch_size: int = 32) -> ModelScore:
    """Mean BERTScore F1 of each reply against its reference, in percent (no idf weighting, no baseline
    rescaling: bert-score's defaults)."""
    from bert_score import score

    if len(replies) != len(references) or not replies:
        raise ValueError(f"BERTScore: {len(replies)} replies and {len(references)} references")
    path = str(model_path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"BERTScore: model directory {path} does not exist (e.g. roberta-large, put there "
                                "by hand: nothing is downloaded)")
    _, _, f1 = score(list(replies), list(references), model_type=path, num_layers=layer, batch_size=batch_size,
                     device="cpu", use_fast_tokenizer=True)
    return ModelScore(100.0 * float(f1.mean()), f"bert-score F1, {os.path.basename(path.rstrip('/'))} layer {layer}, "
                      "no idf, no rescaling", len(replies), tuple(100.0 * float(x) for x in f1))


def last_token_features(model, tokenizer, texts: Sequence[str], *, max_length: int = 256,
                        batch_size: int = 16) -> np.ndarray:
    """[len(texts), hidden] float32: the decoder's final hidden state at each text's last token (texts cut to
    their last `max_length` tokens; batches left-padded, which does not change a row)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from icml_jax.models.sampler import bucket

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
                featurizer: str = "") -> ModelScore:
    """MAUVE between the replies' and the references' feature sets (mauve-text defaults: k-means buckets of
    n/10, scaling factor 5), in percent."""
    import mauve

    p, q = np.asarray(reply_features, np.float32), np.asarray(reference_features, np.float32)
    if p.ndim != 2 or q.ndim != 2 or p.shape[1] != q.shape[1] or len(p) < 2 or len(q) < 2:
        raise ValueError(f"MAUVE: feature sets must be [n >= 2, d] with equal d, got {p.shape} and {q.shape}")
    out = mauve.compute_mauve(p_features=p, q_features=q, seed=seed, verbose=False)
    return ModelScore(100.0 * float(out.mauve), f"mauve-text, seed {seed}, features: {featurizer or 'given'}",
                      len(p))


__all__ = ["ModelScore", "bertscore_f1", "last_token_features", "mauve_score"]
