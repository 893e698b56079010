"""Text embeddings from a local model, and the relevance scores the retrieval baselines rank memories by.

`MeanPoolEncoder` runs one of our Flax decoders (`icml_jax.models`) and mean-pools its final hidden states over
each text's real tokens: a plain, untrained sentence embedding from whatever local checkpoint the user has
(nothing is downloaded). Batches are padded to powers of two in rows and tokens, so it compiles once per
(batch, length) bucket; the model state is passed to the jitted function, not closed over. A BERT directory
(`config.json` of model_type "bert", e.g. all-MiniLM-L6-v2 from `python -m icml_jax.models.fetch all-minilm-l6-v2`)
given as `baselines.encoder_model` gets the trained sentence encoder `icml_jax.models.encoder.SentenceEncoder`
instead, which batches and compiles the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.agents.tiny import tiny_model_config
from icml_jax.memory.lexical import bm25_scores
from icml_jax.models import from_pretrained, load_sentence_encoder, load_tokenizer
from icml_jax.models.backbone import TINY, backbone_config
from icml_jax.models.decoder import Decoder
from icml_jax.models.encoder import is_bert_directory
from icml_jax.models.sampler import bucket

Encoder = Callable[[Sequence[str]], np.ndarray]  # texts -> [N, D] float32


class MeanPoolEncoder:
    """texts -> [N, hidden] float32: the mean of the decoder's final hidden states over each text's first
    `max_length` tokens (no special tokens; an empty text reads one EOS/pad token)."""

    def __init__(self, model, tokenizer, *, max_length: int = 128, batch_size: int = 16, label: str = "") -> None:
        import jax
        import jax.numpy as jnp
        from flax import nnx

        if max_length < 1 or batch_size < 1:
            raise ValueError(f"MeanPoolEncoder: max_length and batch_size must be >= 1, got {max_length}, "
                             f"{batch_size}")
        self.tokenizer, self.max_length, self.batch_size, self.label = tokenizer, max_length, batch_size, label
        graphdef, self._state = nnx.split(model)
        self.dim = int(model.config.hidden_size)
        self.shapes: set[tuple[int, int]] = set()  # (rows, tokens) buckets run so far: one compilation each

        @jax.jit
        def run(state, tokens, mask):
            hidden = nnx.merge(graphdef, state)(tokens, attention_mask=mask, compute_logits=False).hidden
            real = mask[..., None]  # `where`, not a product: a padding position's state may be anything
            total = jnp.where(real, hidden.astype(jnp.float32), 0.0).sum(1)
            return total / jnp.maximum(real.sum(1), 1).astype(jnp.float32)

        self._run = run

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        import jax.numpy as jnp

        if not texts:
            return np.zeros((0, self.dim), np.float32)
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        empty = tok.eos_token_id if tok.eos_token_id is not None else pad
        rows = [tok(t, add_special_tokens=False)["input_ids"][: self.max_length] or [empty] for t in texts]
        out = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            length, n = bucket(max(len(r) for r in chunk), 16), bucket(len(chunk), 1)
            tokens = np.full((n, length), pad, np.int32)
            mask = np.zeros((n, length), bool)
            for i, r in enumerate(chunk):  # left-padded: positions count real tokens only
                tokens[i, length - len(r):], mask[i, length - len(r):] = r, True
            mask[len(chunk):, -1] = True  # filler rows read one pad token (dropped below)
            self.shapes.add((n, length))
            out.append(np.asarray(self._run(self._state, jnp.asarray(tokens), jnp.asarray(mask)))[: len(chunk)])
        return np.concatenate(out, axis=0)


def tiny_encoder(tokenizer, *, hidden: int, layers: int, seed: int, max_length: int = 128) -> MeanPoolEncoder:
    """The tiny setting's stand-in: a random tiny Qwen3-style decoder (`agents.tiny.tiny_model_config`) over the
    evaluation's tokenizer, initialised from `seed`. Its features are random projections, not semantics."""
    from flax import nnx

    model = Decoder(tiny_model_config(len(tokenizer), hidden, layers), rngs=nnx.Rngs(seed))
    return MeanPoolEncoder(model, tokenizer, max_length=max_length, label=f"random tiny decoder (seed {seed})")


def encoder_from_config(config: Any, tokenizer, *, model_dir: str | None, max_length: int) -> Encoder:
    """The dense encoder of a run: `model_dir` (`baselines.encoder_model`), else `config.model.path`, loaded in
    `config.model.dtype`; with `config.model.kind == "tiny"` and no encoder dir, the random tiny decoder seeded
    with `config.seed`. A BERT directory is a sentence encoder (its own tokenizer, pooling and normalisation,
    `max_length` capped by its max_seq_length); any other is a decoder whose final states are mean-pooled."""
    import jax.numpy as jnp

    model = backbone_config(config)
    path = model_dir or (None if model.kind == TINY else model.path)
    if path is None:
        if model.kind != TINY:
            raise ValueError("dense encoder: set config.baselines.encoder_model or config.model.path (a local "
                             "Hugging Face decoder directory; encoder_model may also be a BERT sentence encoder's)")
        return tiny_encoder(tokenizer, hidden=model.hidden, layers=model.layers, seed=int(config.seed),
                            max_length=max_length)
    if not Path(path).is_dir():
        raise FileNotFoundError(f"dense encoder: model directory {path} does not exist (nothing is downloaded)")
    dtype = jnp.dtype(model.dtype)
    if is_bert_directory(path):
        return load_sentence_encoder(path, dtype=dtype, max_length=max_length)
    model = from_pretrained(str(path), dtype=dtype)
    return MeanPoolEncoder(model, load_tokenizer(str(path)), max_length=max_length,
                           label=f"mean-pooled final hidden states of {Path(path).name}")


def cosine(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """[Q, K] cosine similarities of two row sets (a zero vector has similarity 0 with everything)."""
    q = queries / np.maximum(np.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
    k = keys / np.maximum(np.linalg.norm(keys, axis=-1, keepdims=True), 1e-12)
    return q @ k.T


class DenseRelevance:
    """Relevance = cosine similarity of embeddings; each distinct text is encoded once (`forget` clears)."""

    kind = "dense"
    positive_only = False  # every cosine ranks, negative ones too

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[N, D] embeddings, new texts encoded in one batch."""
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            for text, vec in zip(new, np.asarray(self.encoder(new), np.float32), strict=True):
                self._cache[text] = vec
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)

    def scores(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        """[Q, D] cosine similarities (in [-1, 1])."""
        if not queries or not documents:
            return np.zeros((len(queries), len(documents)), np.float32)
        vecs = self.embed(list(queries) + list(documents))
        return cosine(vecs[: len(queries)], vecs[len(queries):])

    def forget(self) -> None:
        """Drop the cached embeddings."""
        self._cache.clear()

    def provenance(self) -> dict[str, Any]:
        """The relevance kind and the encoder's label, for a baseline's provenance."""
        return {"relevance": self.kind, "encoder": getattr(self.encoder, "label", "")}


class LexicalRelevance:
    """Relevance = BM25 of the query against the documents (statistics from the documents themselves)."""

    kind = "bm25"
    positive_only = True  # a score of 0 shares no word with the query: never relevant

    def scores(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        """[Q, D] BM25 scores (>= 0; 0 = no shared word)."""
        return np.asarray([bm25_scores(q, documents) for q in queries], np.float64).reshape(len(queries),
                                                                                            len(documents))

    def forget(self) -> None:
        """Nothing cached."""

    def provenance(self) -> dict[str, Any]:
        """The relevance kind, for a baseline's provenance."""
        return {"relevance": self.kind}


def relevance_from(kind: str, settings: dict[str, Any], ctx: Any) -> DenseRelevance | LexicalRelevance:
    """The relevance `kind` names: "dense" (the run's encoder, as the dense baseline's) or "bm25"."""
    if kind == "bm25":
        return LexicalRelevance()
    if kind != "dense":
        raise ValueError(f"baselines: relevance must be 'dense' or 'bm25', got {kind!r}")
    return DenseRelevance(encoder_from_config(ctx.config, ctx.tokenizer, model_dir=settings.get("encoder_model"),
                                              max_length=int(settings["encoder_max_length"])))


def top_indices(scores: np.ndarray, k: int, *, positive_only: bool) -> list[int]:
    """The (at most) k best indices of a score row, best first; ties go to the later (newer) item."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), -i))
    if positive_only:
        order = [i for i in order if scores[i] > 0]
    return order[: max(0, k)]


__all__ = ["DenseRelevance", "Encoder", "LexicalRelevance", "MeanPoolEncoder", "cosine", "encoder_from_config",
           "relevance_from", "tiny_encoder", "top_indices"]
