"""What the policies read: observation texts and their bucketed, left-padded token arrays.

Lengths round up to powers of two and the Trigger's candidate axis (1 + memories) to powers of two too, so the
scoring programs compile once per (length bucket, candidate bucket) whatever the store holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from icml_jax.agents.prefilter import PREFILTERS, Prefilter, prefilter_for
from icml_jax.models.sampler import bucket, pad_left

Dialogue = Sequence[tuple[str, str]]  # (speaker, text), oldest first


@dataclasses.dataclass(frozen=True)
class ObservationConfig:
    """How much the policies see and how inputs are bucketed."""

    context_turns: int = 4  # recent dialogue turns shown with the utterance
    max_length: int = 256  # tokens per sequence; longer ones keep their end (the utterance)
    min_length_bucket: int = 32
    max_candidates: int = 15  # memories scored per turn (15 + "none" = a 16-wide bucket); the prefilter picks
    # them from the store when it holds more
    min_candidate_bucket: int = 2
    planner_memories: int = 2  # stored memories shown to the Planner (Algorithm 1's o_k = (u_k, H_k, M_k)): the
    # most similar few to the utterance (by the prefilter), so it can see a duplicate coming; 0 = the utterance
    # and dialogue only. 2 measured fewer duplicate saves on the persona world (docs/fidelity.md)
    prefilter: str = "bm25"  # how both are picked (`agents.prefilter`): bm25 (word overlap, `memory.lexical`) |
    # embedding (cosine of sentence embeddings from prefilter_model)
    prefilter_model: str = ""  # the embedding prefilter's local BERT sentence-encoder directory; "" = the fetched
    # all-minilm-l6-v2 (`python -m icml_jax.models.fetch all-minilm-l6-v2`)

    def __post_init__(self) -> None:
        if self.max_length < self.min_length_bucket or self.max_candidates < 1 or self.planner_memories < 0:
            raise ValueError(f"invalid observation config {self}")
        if self.prefilter not in PREFILTERS:
            raise ValueError(f"observation.prefilter must be one of {PREFILTERS}, got {self.prefilter!r}")
        if self.prefilter_model and self.prefilter != "embedding":
            raise ValueError(f"observation.prefilter_model={self.prefilter_model!r} is only read by "
                             f"prefilter='embedding' (prefilter is {self.prefilter!r})")

    def make_prefilter(self) -> Prefilter:
        """The prefilter these settings name (one per process and setting: `agents.prefilter.prefilter_for`)."""
        return prefilter_for(self.prefilter, self.prefilter_model)


def _context(history: Dialogue, utterance: str, turns: int) -> str:
    lines = [f"{speaker}: {text}" for speaker, text in list(history)[-turns:]] if turns else []
    return "\n".join(lines + [f"User: {utterance}"])


def planner_text(history: Dialogue, utterance: str, config: ObservationConfig, memories: Sequence[str] = ()) -> str:
    """The Planner's observation: up to `config.planner_memories` stored memories (given most similar first,
    written most similar last, next to the utterance, so a sequence over the token budget loses the least
    similar first), recent dialogue, the user turn, and the question it answers."""
    shown = list(memories)[: config.planner_memories]
    lines = [f"Memory: {m}" for m in reversed(shown)]
    return "\n".join(lines + [_context(history, utterance, config.context_turns)]) + \
        "\nSave this user turn to long-term memory?"


def planner_memory_indices(utterance: str, memories: Sequence[str], config: ObservationConfig,
                           prefilter: Prefilter | None = None) -> list[int]:
    """Which of `memories` (oldest first) the Planner sees: the `config.planner_memories` most similar to the
    utterance by `prefilter` (None: `config.make_prefilter()`; BM25 keeps only those sharing a word), most
    similar first."""
    prefilter = prefilter or config.make_prefilter()
    return prefilter.similar([utterance], [memories], config.planner_memories)[0]


def trigger_texts(history: Dialogue, utterance: str, memories: Sequence[str], config: ObservationConfig) -> list[str]:
    """One sequence per option: index 0 is 'no memory', index i the i-th candidate memory."""
    ctx = _context(history, utterance, config.context_turns)
    return [f"{ctx}\nMemory: {m}\nUse this memory for the reply?" for m in ["(none)", *memories]]


def _encode(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    out = []
    for text in texts:
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if len(ids) > max_length:  # keep the first (BOS) token and the end of the text
            ids = ids[:1] + ids[len(ids) - max_length + 1:]
        out.append(ids)
    return out


def length_bucket(rows: Sequence[Sequence[int]], config: ObservationConfig) -> int:
    """The length bucket that holds every row."""
    return min(bucket(max(len(r) for r in rows), config.min_length_bucket), bucket(config.max_length))


def encode_planner(tokenizer, texts: Sequence[str], config: ObservationConfig) -> tuple[np.ndarray, np.ndarray]:
    """tokens/mask [B, L] for Planner observations."""
    rows = _encode(tokenizer, texts, config.max_length)
    return pad_left(rows, length_bucket(rows, config), pad_token(tokenizer))


def encode_trigger(
    tokenizer, options: Sequence[Sequence[str]], config: ObservationConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens/mask [B, C, L] and cand_mask [B, C] for Trigger option lists (each from `trigger_texts`)."""
    if any(len(o) > config.max_candidates + 1 for o in options):
        raise ValueError(f"more than max_candidates={config.max_candidates} memories in a Trigger observation")
    encoded = [_encode(tokenizer, texts, config.max_length) for texts in options]
    length = length_bucket([r for rows in encoded for r in rows], config)
    cands = bucket(max(len(rows) for rows in encoded), config.min_candidate_bucket)
    pad = pad_token(tokenizer)
    tokens = np.full((len(options), cands, length), pad, np.int32)
    mask = np.zeros((len(options), cands, length), bool)
    cand_mask = np.zeros((len(options), cands), bool)
    for b, rows in enumerate(encoded):
        t, m = pad_left(rows, length, pad)
        tokens[b, : len(rows)], mask[b, : len(rows)], cand_mask[b, : len(rows)] = t, m, True
    return tokens, mask, cand_mask


def left_pad(x: np.ndarray, length: int, fill: object) -> np.ndarray:
    """Pads the last axis of x on the left to `length`."""
    extra = length - x.shape[-1]
    if extra < 0:
        raise ValueError(f"cannot left-pad length {x.shape[-1]} to {length}")
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(extra, 0)], constant_values=fill)


def stack_planner(rows: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch tokens/mask [B, L] from per-decision Planner rows ([L_i] each, as `encode_planner` made them
    alone), left-padded to the longest: several users' decisions in one forward pass."""
    length = max(t.shape[-1] for t, _ in rows)
    return (np.stack([left_pad(t, length, pad_id) for t, _ in rows]),
            np.stack([left_pad(m, length, False) for _, m in rows]))


def stack_trigger(rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], pad_id: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch tokens/mask [B, C, L] and cand_mask [B, C] from per-decision Trigger rows ([C_i, L_i] each, as
    `encode_trigger` made them alone): lengths left-padded, the candidate axis padded with absent options."""
    cands = max(t.shape[0] for t, _, _ in rows)
    length = max(t.shape[-1] for t, _, _ in rows)
    tokens = np.full((len(rows), cands, length), pad_id, np.int32)
    mask = np.zeros((len(rows), cands, length), bool)
    cand_mask = np.zeros((len(rows), cands), bool)
    for b, (t, m, c) in enumerate(rows):
        tokens[b, : t.shape[0]], mask[b, : t.shape[0]] = left_pad(t, length, pad_id), left_pad(m, length, False)
        cand_mask[b, : t.shape[0]] = c
    return tokens, mask, cand_mask


def pad_token(tokenizer) -> int:
    """The id padding is written with: the pad token, else EOS, else 0."""
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else (tokenizer.eos_token_id or 0))
