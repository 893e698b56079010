"""The defaults of the `baselines` config block (icml_jax.baselines: Table 1's and Table 6's other systems), in the
run layer so that configs/base.py builds its block from them: each written once."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

BASELINE_DEFAULTS: dict[str, Any] = {
    "top_k": 3,  # memories a retrieval baseline puts in the reply prompt (dense, memorybank, mem0)
    "encoder_model": None,  # local dir of the dense encoder: a BERT sentence encoder (e.g. all-minilm-l6-v2) or a
    # HF decoder (mean-pooled states); None: config.model.path (tiny: random)
    "encoder_max_length": 128,  # tokens of a text the encoder reads (the first ones)
    "long_context_tokens": None,  # memory-block budget of long_context; None: from the generator's context (a
    # remote one's llm.generator.context_tokens, else the backbone's)
    "long_context_margin": 32,  # tokens kept free besides the reply and the rest of the prompt (chat template)
    "memorybank": {
        "retention_threshold": 0.1,  # memories whose retention exp(-dt / S) falls below this are forgotten
        "summary_max_tokens": 192,
        "facts_max_tokens": 512,
        "max_facts": 10,  # facts extracted per session
        "relevance": "dense",  # dense (the encoder, as MemoryBank's embedding index) | bm25
    },
    "mem0": {
        "similar": 5,  # existing memories shown to the update decision of each new fact
        "max_facts": 5,  # candidate facts extracted per turn
        "facts_max_tokens": 256,
        "decide_max_tokens": 256,
        "relevance": "dense",  # dense (the encoder, as Mem0's vector store) | bm25
    },
    "rsum": {
        "summary_max_tokens": 256,  # the running summary, rewritten after each earlier session
    },
    "comedy": {
        "session_max_tokens": 192,  # one session's memory
        "compress_max_tokens": 384,  # the compressive memory (profile, relationship, events)
    },
    "memochat": {
        "memo_max_tokens": 384,  # the topic memos of one session
        "retrieve_max_tokens": 64,  # the memo ids picked for a reply (at most top_k memos are shown)
        "listed_tokens": 0,  # 0: a retrieval request lists every memo (MemoChat); n: the newest fitting n tokens
    },
    "ld_agent": {
        "relevance": "dense",  # dense (the encoder) | bm25: the semantic part of the event score
        "topic_weight": 1.0,  # weight of the topic overlap (share of the query's content words) in the score
        "recency_tau": 10.0,  # sessions: an event's score decays as exp(-sessions since it / recency_tau)
        "max_traits": 5,  # persona traits extracted per speaker and session
        "persona_shown": 10,  # newest traits of each speaker's persona shown to a reply
        "summary_max_tokens": 192,
        "persona_max_tokens": 256,
    },
    "a_mem": {
        "relevance": "dense",  # dense (the encoder) | bm25: how notes are found for linking and for replies
        "link_k": 5,  # most similar stored notes shown to a new note's link / evolution decision
        "neighbours": 2,  # linked notes shown with each retrieved note
        "max_keywords": 5,  # keywords per note
        "note_max_tokens": 256,
        "evolve_max_tokens": 256,
    },
    "memoryos": {
        "relevance": "dense",  # dense (the encoder) | bm25: page-segment similarity and retrieval
        "short_term_pages": 7,  # STM queue length; the oldest page overflows to MTM (FIFO)
        "mid_term_segments": 50,  # MTM capacity; beyond it the coldest segment is dropped
        "segment_threshold": 0.6,  # relevance + Jaccard a page needs to join an existing segment
        "heat_threshold": 5.0,  # heat (visits + new pages + recency) at which a segment is promoted
        "recency_tau": 10.0,  # sessions: the recency term of heat is exp(-sessions since last visit / tau)
        "pages_per_segment": 3,  # pages of each retrieved segment shown to a reply
        "max_knowledge": 100,  # user knowledge facts kept (FIFO)
        "knowledge_shown": 5,  # most relevant knowledge facts shown to a reply
        "max_facts": 5,  # facts one promotion may add
        "promote_max_tokens": 384,
    },
    "theanine": {
        "relevance": "dense",  # dense (the encoder) | bm25: link candidates and reply anchors
        "link_candidates": 5,  # earlier memories shown to a new memory's relation decision
        "timeline_length": 5,  # memories on a retrieved timeline (nearest in links to the anchor)
        "max_facts": 10,  # memories extracted per session
        "facts_max_tokens": 512,
        "link_max_tokens": 256,
        "refine_max_tokens": 192,  # the refined timeline context a reply gets
    },
}
BASELINE_NULLABLE = {"encoder_model": str, "long_context_tokens": int}  # None by default: typed placeholders


def baselines_block() -> ml_collections.ConfigDict:
    """The `baselines` block of configs/base.py: the defaults, None keys as typed placeholders."""
    values = copy.deepcopy(BASELINE_DEFAULTS)
    for key, kind in BASELINE_NULLABLE.items():
        values[key] = placeholder(kind)
    return ml_collections.ConfigDict(values)


def _merge(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """`defaults` with the keys of `given` on top, nested blocks merged key by key."""
    out = copy.deepcopy(dict(defaults))
    for key, value in given.items():
        if isinstance(out.get(key), dict) and isinstance(value, Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def baseline_settings_of(block: Any) -> dict[str, Any]:
    """The `baselines` block (a ConfigDict, a mapping or None) over `BASELINE_DEFAULTS`, as a new plain dict."""
    if block is None:
        return copy.deepcopy(BASELINE_DEFAULTS)
    return _merge(BASELINE_DEFAULTS, block.to_dict() if hasattr(block, "to_dict") else dict(block))


__all__ = ["BASELINE_DEFAULTS", "BASELINE_NULLABLE", "baseline_settings_of", "baselines_block"]
