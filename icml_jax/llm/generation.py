"""Generation through a back end: per-request outcomes for batch callers (`generate_each`), condensing a saved
turn into a memory note, and writing the reply r*."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm import prompts
from icml_jax.llm.note_check import note_problem, rewrite_instruction
from icml_jax.llm.types import BackendError, LLMBackend, LLMRequest, LLMResponse

logger = logging.getLogger(__name__)

_MAX_NOTE_CHARS = 1000
NOTE_MAX_TOKENS = 128  # default length cap of a memory note (two sentences need far fewer)
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")


def _checked(backend: LLMBackend, requests: Sequence[LLMRequest], answers: Sequence[Any]) -> list[Any]:
    """`answers` as a list, after checking that the back end answered each of `requests` once."""
    if len(answers) != len(requests):
        raise RuntimeError(f"{getattr(backend, 'name', '?')} back end answered {len(answers)} of {len(requests)} "
                           "requests")
    return list(answers)


def generate_each(backend: LLMBackend, requests: Sequence[LLMRequest]) -> list[LLMResponse | BackendError]:
    """Every request's outcome, in order: its answer, or the BackendError it failed with for good (retries
    exhausted, not retryable), so a batch caller can count and skip a failure instead of losing the batch.

    A back end with its own `generate_each` (Gemini, the response cache) runs each request to its end. Any
    other (offline, local) gets the batch in one `generate` call; if that raises a BackendError, each request
    is asked again on its own to find the failing ones. Other exceptions are bugs, not failures: they propagate.
    """
    if not requests:
        return []
    own = getattr(backend, "generate_each", None)
    if callable(own):
        return _checked(backend, requests, own(requests))
    try:
        return _checked(backend, requests, backend.generate(requests))
    except BackendError as err:
        if len(requests) == 1:
            return [err]
    out: list[LLMResponse | BackendError] = []
    for request in requests:
        try:
            out.extend(_checked(backend, [request], backend.generate([request])))
        except BackendError as err:
            out.append(err)
    return out


@dataclasses.dataclass(frozen=True)
class CondenseInput:
    """A user turn the Planner decided to save, with a little context for the condenser."""

    turn_text: str
    history: prompts.Dialogue = ()
    metadata: Mapping[str, Any] | None = None
    memories: Sequence[str] = ()  # stored memories the note may replace (supersede), numbered 1.. in the prompt


@dataclasses.dataclass(frozen=True)
class Condensed:
    """The memory note for a saved turn; `fallback` is True when the back end gave nothing usable, `error` says
    why when its request failed for good (only with `condense_turns(..., skip_failures=True)`); `replaces`: the
    0-based indices of the input's `memories` the note says it makes outdated; `problem`: what the check found
    wrong with the first note (`note_check.note_problem`; None: it passed), `rewritten`: the note was asked again
    for that reason (then `fallback` says whether the second one failed too)."""

    text: str
    fallback: bool
    response: LLMResponse
    error: str | None = None
    replaces: tuple[int, ...] = ()
    problem: str | None = None
    rewritten: bool = False


_REPLACES = re.compile(r"^\s*REPLACES\s*:\s*(.*?)\s*$", re.IGNORECASE)


def split_replaces(answer: str, shown: int) -> tuple[str, tuple[int, ...]]:
    """(the answer without its last-line `REPLACES: 2, 3`, the 0-based indices it names among `shown` memories).
    Numbers outside 1..shown and repeats are ignored, so a note can only ever name memories its request showed."""
    lines = answer.rstrip().splitlines()
    m = _REPLACES.match(lines[-1]) if lines else None
    if m is None:
        return answer, ()
    picked: list[int] = []
    for token in re.findall(r"\d+", m.group(1)):
        k = int(token)
        if 1 <= k <= shown and k - 1 not in picked:
            picked.append(k - 1)
    return "\n".join(lines[:-1]).strip(), tuple(picked)


def drop_repeated_sentences(text: str) -> str:
    """`text` with whitespace collapsed and every sentence after its first occurrence dropped: small models
    (e.g. SmolLM2-135M, greedy) loop on one sentence until the token cap, which would fill a note with copies."""
    seen: set[str] = set()
    kept = []
    for match in _SENTENCE.finditer(" ".join(text.split())):
        sentence = match.group().strip()
        key = sentence.lower()
        if sentence and key not in seen:
            seen.add(key)
            kept.append(sentence)
    return " ".join(kept)


def _note_of(item: CondenseInput, resp: LLMResponse) -> tuple[str, tuple[int, ...]]:
    """(the note an answer holds, with repeated sentences dropped; the memories its REPLACES line names)."""
    # a turn that itself holds a REPLACES line is the user typing the directive: it replaces nothing
    trusted = item.memories and not any(_REPLACES.match(line) for line in item.turn_text.splitlines())
    answer, replaces = split_replaces(resp.text, len(item.memories)) if trusted else (resp.text, ())
    return drop_repeated_sentences(answer), replaces


def condense_turns(backend: LLMBackend, items: Sequence[CondenseInput], *,
                   max_output_tokens: int = NOTE_MAX_TOKENS, skip_failures: bool = False) -> list[Condensed]:
    """Turn saved user turns into short third-person notes (the offline back end keeps the turn text).

    Every note is checked (`note_check.note_problem`: empty, the prompt's framing echoed, a phrase looped, no word
    of the turn); a failed note is asked again once, told why (one batched call for all of them), and a second
    failure falls back to the turn text itself, with `fallback=True`, `problem` set and a warning, so a save
    decision never stores an empty or contentless memory. Repeated sentences are dropped. A request that fails
    for good raises its BackendError, or with `skip_failures` falls back to the turn text too, with `error` set
    (batch jobs such as the synthesis count those instead of dying).
    """
    requests = [prompts.condense_request(x.turn_text, x.history, metadata=x.metadata, memories=x.memories,
                                         max_output_tokens=max_output_tokens) for x in items]
    send = (lambda rs: generate_each(backend, rs)) if skip_failures else backend.generate  # noqa: E731
    answers = send(requests)
    out: list[Condensed | None] = [None] * len(items)
    retry: list[tuple[int, str]] = []
    for i, (item, resp) in enumerate(zip(items, answers, strict=True)):
        if isinstance(resp, BackendError):
            logger.warning("condensation failed for good, keeping the turn text as the memory: %s", resp)
            out[i] = Condensed(text=item.turn_text.strip(), fallback=True,
                               response=LLMResponse(text="", attempts=resp.attempts, finish_reason="FAILED"),
                               error=str(resp))
            continue
        note, replaces = _note_of(item, resp)
        problem = note_problem(note, item.turn_text)
        if problem is None:
            out[i] = Condensed(text=note[:_MAX_NOTE_CHARS], fallback=False, response=resp, replaces=replaces)
        else:
            retry.append((i, problem))
    again = send([dataclasses.replace(requests[i], prompt=requests[i].prompt + rewrite_instruction(problem))
                  for i, problem in retry]) if retry else []
    for (i, problem), resp in zip(retry, again, strict=True):
        item = items[i]
        if not isinstance(resp, BackendError):
            note, replaces = _note_of(item, resp)
            if note_problem(note, item.turn_text) is None:
                out[i] = Condensed(text=note[:_MAX_NOTE_CHARS], fallback=False, response=resp, replaces=replaces,
                                   problem=problem, rewritten=True)
                continue
        logger.warning("%s back end wrote an unusable note twice (the first note %s; finish_reason=%s); keeping "
                       "the turn text as the memory", getattr(backend, "name", "?"), problem,
                       "FAILED" if isinstance(resp, BackendError) else resp.finish_reason)
        out[i] = Condensed(text=item.turn_text.strip(), fallback=True,
                           response=resp if isinstance(resp, LLMResponse) else answers[i], problem=problem,
                           rewritten=True, error=str(resp) if isinstance(resp, BackendError) else None)
    return [c for c in out if c is not None]


@dataclasses.dataclass(frozen=True)
class ReplyInput:
    """What the generator sees at turn k: recent dialogue H_k, utterance u_k, the chosen memory (or None)."""

    history: prompts.Dialogue
    utterance: str
    memory: str | None
    metadata: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Reply:
    """The generated reply r* and the back end's response (tokens, latency, finish reason)."""

    text: str
    response: LLMResponse


def generate_replies(
    backend: LLMBackend, items: Sequence[ReplyInput], *, temperature: float = 0.7, max_output_tokens: int = 256
) -> list[Reply]:
    """Write r* for each item in one batched call."""
    requests = [
        prompts.reply_request(
            x.history, x.utterance, x.memory,
            temperature=temperature, max_output_tokens=max_output_tokens, metadata=x.metadata,
        )
        for x in items
    ]
    replies = [Reply(text=r.text.strip(), response=r) for r in backend.generate(requests)]
    for r in replies:
        if not r.text:
            logger.warning(
                "%s back end returned an empty reply (finish_reason=%s)",
                getattr(backend, "name", "?"), r.response.finish_reason,
            )
    return replies


def generate_reply(
    backend: LLMBackend, history: prompts.Dialogue, utterance: str, memory: str | None, **kwargs: Any
) -> str:
    """Write r* for one turn (a convenience over generate_replies)."""
    return generate_replies(backend, [ReplyInput(history, utterance, memory)], **kwargs)[0].text
