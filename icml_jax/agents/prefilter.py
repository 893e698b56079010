"""Which stored memories the policies read: the Trigger's candidate prefilter and the Planner's memory view.

`observation.prefilter` names the ranking: "bm25" (the default; word overlap, `memory.lexical`) or "embedding"
(cosine similarity of a local sentence encoder's mean-pooled embeddings: `observation.prefilter_model`, by
default all-MiniLM-L6-v2 from `python -m icml_jax.models.fetch all-minilm-l6-v2`). Both rank the same text of a
memory (`memory_document`: its note and the turn it was condensed from) and break ties towards the newer memory.

The Trigger's cap (`capped`) keeps every memory while a user holds at most `k`, else the `k` best in creation
order; the Planner's view (`similar`) is the `k` best, best first (BM25: only memories sharing a word with the
utterance). The encoder runs here, outside the policies' jitted programs: memory embeddings are cached per text
(a memory's text never changes; least recently used evicted past `CACHE_SIZE`), each call's utterances and new
memories go through the encoder in one batch, and the encoder buckets rows and lengths to powers of two, so it
compiles a bounded number of programs. `prefilter_for` builds one prefilter per (kind, directory) per process:
every agent of a run shares the loaded encoder and its cache.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from icml_jax.memory.lexical import bm25_scores, most_similar, rank
from icml_jax.models import fetch
from icml_jax.models.encoder import is_bert_directory, load_sentence_encoder

PREFILTERS = ("bm25", "embedding")
DEFAULT_MODEL = "all-minilm-l6-v2"  # `models.fetch` name of the embedding prefilter's encoder when none is named
CACHE_SIZE = 65536  # memory texts whose embeddings are kept (384 float32 each for MiniLM: ~100 MB at most)

Encoder = Callable[[Sequence[str]], np.ndarray]  # texts -> [N, D] float32
Documents = Sequence[Sequence[str]]  # one list of memory texts per query, oldest first


class Prefilter(Protocol):
    """A ranking of memory texts against queries, batched over queries."""

    kind: str

    def capped(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]: ...

    def similar(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]: ...


def memory_document(fragment) -> str:
    """The text a prefilter ranks a stored memory by: its note and the turn it was condensed from."""
    return f"{fragment.text} {fragment.source_text}"


def _cap(n: int, k: int, ranked: Callable[[], list[int]]) -> list[int]:
    """All of n documents when they fit under k, else the k best (`ranked`, computed only then) in index order."""
    if k <= 0:
        return []
    return list(range(n)) if n <= k else sorted(ranked()[:k])


class LexicalPrefilter:
    """BM25 over word tokens, statistics from each user's own memories (`memory.lexical`)."""

    kind = "bm25"
    label = "BM25 (memory.lexical)"

    def capped(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]:
        """Per query: every document while there are at most k, else the k highest BM25 in index order."""
        return [_cap(len(d), k, lambda q=q, d=d: rank(bm25_scores(q, d))) for q, d in zip(queries, documents,
                                                                                        strict=True)]

    def similar(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]:
        """Per query: the (at most) k documents sharing a word with it, highest BM25 first."""
        return [most_similar(q, d, k) for q, d in zip(queries, documents, strict=True)]


class EmbeddingPrefilter:
    """Cosine similarity of sentence embeddings; memory texts are embedded once (LRU cache of `cache_size`)."""

    kind = "embedding"

    def __init__(self, encoder: Encoder, *, cache_size: int = CACHE_SIZE, label: str = "") -> None:
        if cache_size < 1:
            raise ValueError(f"EmbeddingPrefilter: cache_size must be >= 1, got {cache_size}")
        self.encoder, self.cache_size = encoder, cache_size
        self.label = label or getattr(encoder, "label", type(encoder).__name__)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.encoded = 0  # texts run through the encoder so far (queries and cache misses)

    def _embed(self, queries: Sequence[str], documents: Sequence[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Query embeddings [Q, D] and {document: embedding}; queries and uncached documents in one encoder call."""
        docs = list(dict.fromkeys(documents))
        new = [d for d in docs if d not in self._cache]
        vecs = np.asarray(self.encoder(list(queries) + new), np.float32) if queries or new else np.zeros((0, 0))
        if vecs.shape[0] != len(queries) + len(new):
            raise ValueError(f"EmbeddingPrefilter: the encoder {self.label} returned {vecs.shape[0]} embeddings for "
                             f"{len(queries) + len(new)} texts")
        self.encoded += vecs.shape[0]
        out = dict(zip(new, vecs[len(queries):], strict=True))
        for d in docs:
            if d not in out:
                out[d] = self._cache[d]
                self._cache.move_to_end(d)
        for d in new:
            self._cache[d] = out[d]
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return vecs[: len(queries)], out

    def scores(self, queries: Sequence[str], documents: Documents) -> list[np.ndarray]:
        """Per query, the cosine similarity [len(documents[i])] of each of its documents."""
        qv, table = self._embed(queries, [d for docs in documents for d in docs])
        out = []
        for q, docs in zip(qv, documents, strict=True):
            if not docs:
                out.append(np.zeros((0,), np.float32))
                continue
            keys = np.stack([table[d] for d in docs])
            keys = keys / np.maximum(np.linalg.norm(keys, axis=-1, keepdims=True), 1e-12)
            out.append(keys @ (q / max(float(np.linalg.norm(q)), 1e-12)))
        return out

    def capped(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]:
        """Per query: every document while there are at most k, else the k most similar in index order; only
        queries over the cap reach the encoder."""
        over = [i for i, d in enumerate(documents) if k > 0 and len(d) > k]
        scored = dict(zip(over, self.scores([queries[i] for i in over], [documents[i] for i in over]),
                          strict=True)) if over else {}
        return [_cap(len(d), k, lambda i=i: rank(scored[i].tolist())) for i, d in enumerate(documents)]

    def similar(self, queries: Sequence[str], documents: Documents, k: int) -> list[list[int]]:
        """Per query: the (at most) k most similar documents, best first."""
        live = [i for i, d in enumerate(documents) if k > 0 and d]
        scored = dict(zip(live, self.scores([queries[i] for i in live], [documents[i] for i in live]),
                          strict=True)) if live else {}
        return [rank(scored[i].tolist())[:k] if i in scored else [] for i in range(len(documents))]

    def cached(self) -> int:
        """How many memory texts have their embedding cached."""
        return len(self._cache)


def encoder_directory(model: str) -> Path:
    """The embedding prefilter's encoder directory: `model`, or the fetched all-MiniLM-L6-v2 when "".

    Raises FileNotFoundError naming the fetch command, ValueError when the directory is not a BERT encoder's."""
    if not model:
        directory = fetch.model_dir(DEFAULT_MODEL)
        if not fetch.is_converted(directory, DEFAULT_MODEL):
            raise FileNotFoundError(
                f"observation.prefilter='embedding' reads the sentence encoder {DEFAULT_MODEL}, which is not "
                f"fetched in {directory}: run `{fetch.fetch_command(DEFAULT_MODEL)}`, or set "
                "observation.prefilter_model to a local BERT sentence-encoder directory")
        return directory
    directory = Path(model).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"observation.prefilter_model={model!r} is not a directory (nothing is downloaded; "
                                f"`{fetch.fetch_command(DEFAULT_MODEL)}` fetches the default encoder)")
    if not is_bert_directory(directory):
        raise ValueError(f"observation.prefilter_model={model!r} is not a BERT sentence encoder (its config.json "
                         "must have model_type 'bert', as all-MiniLM-L6-v2's has)")
    return directory


@functools.lru_cache(maxsize=4)
def _shared(kind: str, model: str) -> Prefilter:
    if kind == "bm25":
        return LexicalPrefilter()

    return EmbeddingPrefilter(load_sentence_encoder(encoder_directory(model)))


def prefilter_for(kind: str, model: str = "") -> Prefilter:
    """The prefilter `observation.prefilter` / `prefilter_model` name, built once per process and shared."""
    if kind not in PREFILTERS:
        raise ValueError(f"observation.prefilter must be one of {PREFILTERS}, got {kind!r}")
    if kind == "bm25" and model:
        raise ValueError(f"observation.prefilter_model={model!r} is only read by prefilter='embedding'")
    resolved = str(Path(model).expanduser().resolve()) if model else ""
    return _shared(kind, resolved)


__all__ = ["CACHE_SIZE", "DEFAULT_MODEL", "EmbeddingPrefilter", "Encoder", "LexicalPrefilter", "PREFILTERS",
           "Prefilter", "encoder_directory", "memory_document", "prefilter_for"]
