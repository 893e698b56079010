"""Cheap lexical relevance (BM25 over word tokens): caps the Trigger's candidate list and picks the stored
memories shown to the Planner."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(
    """a an the and or but if then so to of in on at for with about as is are was were be been being do does did
    have has had it its this that these those you your i me my we our they them their he she his her what how why
    when where who which not no yes just really very too also can could would should will there here from by
    user""".split()
)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stop words."""
    return [w for w in (m.group(0).lower() for m in _WORD.finditer(text or "")) if w not in _STOP]


def bm25_scores(query: str, documents: Sequence[str], *, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """BM25 score of each document for `query`; statistics come only from `documents` (one user's memory)."""
    q = set(tokenize(query))
    docs = [Counter(tokenize(d)) for d in documents]
    if not q or not docs:
        return [0.0] * len(docs)
    n = len(docs)
    avg_len = sum(sum(d.values()) for d in docs) / n or 1.0
    df = {t: sum(1 for d in docs if t in d) for t in q}
    scores = []
    for d in docs:
        length = sum(d.values())
        s = 0.0
        for t in q:
            tf = d.get(t, 0)
            if tf:
                idf = math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg_len))
        scores.append(s)
    return scores


def most_similar(query: str, documents: Sequence[str], k: int) -> list[int]:
    """Indices of the (at most) `k` documents with the highest positive BM25 score for `query`, best first;
    ties go to the later document (the newer memory). Documents sharing no word with the query are left out."""
    if k <= 0 or not documents:
        return []
    scores = bm25_scores(query, documents)
    return [i for i in rank(scores) if scores[i] > 0.0][:k]


def rank(scores: Sequence[float]) -> list[int]:
    """Indices of `scores` best first; equal scores put the later index (the newer memory) first."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], -i))
