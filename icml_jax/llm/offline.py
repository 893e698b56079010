"""Offline back end: deterministic answers without network, for tests and the demo world.

It dispatches on `LLMRequest.task` and reads hints from `LLMRequest.metadata` (never from the prompt text, so
prompts can change freely):
- condense: returns `metadata['turn_text']` unchanged (the offline world keeps the turn text as the memory),
  plus a `REPLACES:` line naming the shown memories whose label fact (`metadata['memory_facts']`) is the one the
  turn overwrites (`metadata['supersedes']`): a writer that recognises every outdated fact (an oracle);
- reply: a template reply that quotes `metadata['memory']` when one is given;
- proxy_judge: `metadata['label']` (the turn's y_p, 0/1 or a value in [0, 1]) when present, else a lexical
  heuristic of self-disclosure and specific facts;
- quality_judge: when `metadata['label_needed']` is present (refs of the past turns y_t says the utterance needs;
  empty = none needed), scores depend on whether `metadata['used_ref']` (ref of the chosen memory's source turn,
  None = no memory) is one of them; otherwise a lexical heuristic of memory / utterance / reply overlap.
- pairwise_judge: the side whose quality score (as above, from `metadata['used_refs']` or the heuristic) is
  higher; equal scores are a tie.
- any other task with a registered answer function (`register_offline_answers`): that function. The layers
  above register theirs when imported, so this module knows none of them: `icml_jax.synthesis.offline_world`
  writes and annotates storylines from the persona world's templates (synthesis_seed / _prequel / _opening /
  _sequel / _annotate), and the baselines answer their own tasks.
Judge and synthesis answers are JSON text, so callers exercise the same parsing path as with a real model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Hashable, Mapping, Sequence
from collections.abc import Callable, Iterable
from typing import Any

from icml_jax.llm.prompts import QUALITY_DIMENSIONS
from icml_jax.llm.types import (
    TASK_CONDENSE,
    TASK_GENERIC,
    TASK_PAIRWISE_JUDGE,
    TASK_PROXY_JUDGE,
    TASK_QUALITY_JUDGE,
    TASK_REPLY,
    LLMRequest,
    LLMResponse,
    TokenUsage,
    UsageMeter,
)

_WORD = re.compile(r"[A-Za-z0-9']+")
_SELF = re.compile(r"\b(i|i'm|im|i've|ive|i'd|my|me|mine|myself|we|our|us)\b", re.IGNORECASE)
_FACT_WORDS = frozenset(
    """name named live lives living moved move work works job career boss wife husband partner son daughter kid kids
    child children mom mother dad father brother sister family dog cat pet born birthday age old years favorite
    favourite allergic allergy study studying school college university degree married divorced hobby hobbies love
    hate vegan vegetarian sick hospital doctor surgery retire retired teacher engineer nurse play plays playing
    travel trip visit visiting plan planning wedding baby pregnant car house apartment city town country""".split()
)
_STOP = frozenset(
    """a an the and or but if then so to of in on at for with about as is are was were be been being do does did
    have has had it its this that these those you your yours i me my we our they them their he she his her what
    how why when where who which not no yes just really very too also can could would should will shall may might
    there here from by up down out over into than all any some""".split()
)


def _tokens(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text or "")]


def _content(text: str) -> set[str]:
    return {w for w in _tokens(text) if w not in _STOP and len(w) > 2}


def _freeze(ref: Any) -> Hashable:
    """Make a JSON-ish ref comparable: lists become tuples, dicts sorted tuples."""
    if isinstance(ref, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in ref.items()))
    if isinstance(ref, (list, tuple)):
        return tuple(_freeze(x) for x in ref)
    return ref


OfflineAnswer = Callable[[str, Mapping[str, Any]], str]  # (task, request metadata) -> answer text
_ANSWERS: dict[str, OfflineAnswer] = {}


def register_offline_answers(tasks: Iterable[str], answer: OfflineAnswer) -> None:
    """Makes the offline back end answer `tasks` with `answer(task, metadata)`; a task already taken by another
    function is refused (two layers would silently disagree on its answers)."""
    for task in tasks:
        current = _ANSWERS.get(task)
        if current is not None and current is not answer:
            raise ValueError(f"offline back end: task {task!r} already answered by {current.__module__}."
                             f"{current.__qualname__}")
        _ANSWERS[task] = answer


def heuristic_information_value(text: str) -> float:
    """Deterministic [0, 1] guess of how worth remembering a user turn is (self-disclosure + specific facts)."""
    words = _tokens(text)
    if not words:
        return 0.0
    self_refs = len(_SELF.findall(text))
    facts = sum(1 for w in words if w in _FACT_WORDS)
    raw_words = _WORD.findall(text)
    proper = sum(1 for i, w in enumerate(raw_words) if i > 0 and w[:1].isupper() and w.lower() not in ("i", "i'm"))
    numbers = sum(1 for w in words if any(ch.isdigit() for ch in w))
    score = (
        0.05
        + 0.30 * min(1.0, self_refs / 2.0)
        + 0.35 * min(1.0, facts / 2.0)
        + 0.15 * min(1.0, (proper + numbers) / 2.0)
        + 0.15 * min(1.0, len(words) / 20.0)
    )
    if text.strip().endswith("?") and self_refs == 0:
        score *= 0.5
    return round(min(1.0, max(0.0, score)), 4)


def _label_quality(needed: Sequence[Any], used: Any) -> dict[str, int]:
    needed_set = {_freeze(r) for r in needed}
    used_f = _freeze(used) if used is not None else None
    if needed_set:
        if used_f is not None and used_f in needed_set:
            return dict(engagingness=4, humanness=4, coherence=5, consistency=5, memorability=5)
        if used_f is None:
            return dict(engagingness=3, humanness=4, coherence=3, consistency=3, memorability=1)
        return dict(engagingness=3, humanness=4, coherence=2, consistency=3, memorability=2)
    if used_f is None:
        return dict(engagingness=3, humanness=4, coherence=4, consistency=4, memorability=3)
    return dict(engagingness=3, humanness=4, coherence=3, consistency=4, memorability=2)


def _heuristic_quality(utterance: str, reply: str, memory: str | None) -> dict[str, int]:
    u, r = _content(utterance), _content(reply)
    on_topic = len(u & r) / max(1, len(u))
    scores = dict(engagingness=3, humanness=4, coherence=3 + int(on_topic > 0.2), consistency=4, memorability=3)
    if memory:
        m = _content(memory)
        relevance = len(m & u) / max(1, min(len(m), len(u))) if m and u else 0.0
        if relevance >= 0.2:
            scores["memorability"] = 4 + int(relevance >= 0.5)
        else:
            scores["memorability"] = 2
            scores["coherence"] = max(1, scores["coherence"] - 1)
    return scores


def _default_for_schema(schema: Mapping[str, Any]) -> Any:
    """A deterministic value that satisfies a simple JSON schema (object/number/integer/string/bool/array)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties", {}) or {}
        return {k: _default_for_schema(v) for k, v in props.items()}
    if kind in ("number", "integer"):
        lo, hi = schema.get("minimum", 0), schema.get("maximum", schema.get("minimum", 0))
        mid = (lo + hi) / 2
        return int(round(mid)) if kind == "integer" else mid
    if kind == "string":
        return ""
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    return None


class OfflineBackend:
    """Deterministic, network-free LLM back end (see module docstring for the metadata it reads)."""

    name = "offline"

    def __init__(self) -> None:
        self._meter = UsageMeter()

    def __repr__(self) -> str:
        return "OfflineBackend()"

    @property
    def usage(self) -> TokenUsage:
        """Totals (whitespace-token counts) since construction."""
        return self._meter.usage

    def close(self) -> None:
        """Nothing to release."""

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answer each request deterministically, in order."""
        return [self._one(r) for r in requests]

    def _one(self, request: LLMRequest) -> LLMResponse:
        text = self._answer(request)
        prompt_tokens = len(request.prompt.split()) + len((request.system or "").split())
        output_tokens = len(text.split())
        self._meter.add(prompt_tokens=prompt_tokens, output_tokens=output_tokens, calls=1, attempts=1)
        return LLMResponse.answering(
            request,
            text,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            finish_reason="STOP",
        )

    def _answer(self, request: LLMRequest) -> str:
        md = request.metadata or {}
        if request.task == TASK_CONDENSE:
            note = str(md.get("turn_text", request.prompt)).strip()
            old, facts = md.get("supersedes"), md.get("memory_facts") or ()
            replaced = [str(i) for i, fact in enumerate(facts, 1) if old is not None and fact == old]
            return note + (f"\nREPLACES: {', '.join(replaced)}" if replaced else "")
        if request.task == TASK_REPLY:
            utterance = str(md.get("utterance", "")).strip()
            memory = md.get("memory")
            said = utterance if len(utterance) <= 80 else utterance[:77] + "..."
            head = f"From our earlier chats: {str(memory).strip().rstrip('.')}. " if memory else ""
            return f'{head}You said "{said}" - tell me more about that.'
        if request.task == TASK_PROXY_JUDGE:
            label = md.get("label")
            if label is not None:
                score = float(label)
                if not 0.0 <= score <= 1.0:
                    raise ValueError(f"offline back end: proxy label must be in [0, 1], got {label!r}")
                reason = "from label"
            else:
                score = heuristic_information_value(str(md.get("turn_text", "")))
                reason = "lexical heuristic"
            return json.dumps({"score": score, "reason": reason})
        if request.task == TASK_QUALITY_JUDGE:
            if "label_needed" in md and md["label_needed"] is not None:
                scores = _label_quality(list(md["label_needed"]), md.get("used_ref"))
                reason = "from labels"
            else:
                scores = _heuristic_quality(
                    str(md.get("utterance", "")), str(md.get("reply", "")), md.get("memory")
                )
                reason = "lexical heuristic"
            return json.dumps({**{d: scores[d] for d in QUALITY_DIMENSIONS}, "reason": reason})
        if request.task == TASK_PAIRWISE_JUDGE:  # the mean quality score of each side, as above; equal = tie
            means = []
            for i in range(2):
                if md.get("label_needed") is not None:
                    scores = _label_quality(list(md["label_needed"]), (md.get("used_refs") or [None, None])[i])
                else:
                    scores = _heuristic_quality(str(md.get("utterance", "")), str(md["replies"][i]),
                                                md["memories"][i])
                means.append(sum(scores.values()))
            better = "tie" if means[0] == means[1] else ("1" if means[0] > means[1] else "2")
            return json.dumps({"reason": "from labels" if md.get("label_needed") is not None else "heuristic",
                               "better": better})
        if request.task in _ANSWERS:
            return _ANSWERS[request.task](request.task, md)
        if request.task != TASK_GENERIC:  # a named task nobody registered: a default answer would be silently wrong
            raise ValueError(f"offline back end: no answer for task {request.task!r}; the module that defines it "
                             "registers one with register_offline_answers when imported (e.g. icml_jax.synthesis)")
        if request.json_schema is not None:
            return json.dumps(_default_for_schema(request.json_schema))
        digest = hashlib.sha256(request.prompt.encode("utf-8")).hexdigest()[:8]
        return f"offline answer {digest}"
