"""The prompts of Retrospective Session Synthesis (cold start): seed sessions, backward prequels, forward
annotation, and the forward generation it is compared with (an opening session, then sequels in time order).

They are built like the agent's prompts (`icml_jax.llm.prompts`): text written by or about the user (facts,
sessions, an error quoted back) goes in quoted blocks, and the system prompt says so. Each builder returns an
LLMRequest whose `metadata` carries the structured inputs the offline back end reads instead of the prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm.prompts import DATA_NOTE, Dialogue, format_session_block, merge_metadata, neutralise, quote
from icml_jax.llm.types import LLMRequest

# Task names of the synthesis requests (real back ends ignore them; the offline back end dispatches on them).
TASK_SYNTH_SEED = "synthesis_seed"
TASK_SYNTH_PREQUEL = "synthesis_prequel"
TASK_SYNTH_ANNOTATE = "synthesis_annotate"
TASK_SYNTH_OPENING = "synthesis_opening"  # forward synthesis: the first session, from the seed's constraints
TASK_SYNTH_SEQUEL = "synthesis_sequel"  # forward synthesis: the next session, from the sessions so far
SYNTHESIS_TASKS: tuple[str, ...] = (TASK_SYNTH_SEED, TASK_SYNTH_PREQUEL, TASK_SYNTH_ANNOTATE, TASK_SYNTH_OPENING,
                                    TASK_SYNTH_SEQUEL)

# Written sessions use two generic roles; the synthesizer maps them to the dataset's speaker labels.
SYNTH_ROLES: tuple[str, str] = ("user", "assistant")

_TURNS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "speaker": {"type": "string", "enum": list(SYNTH_ROLES)},
            "text": {"type": "string"},
        },
        "required": ["speaker", "text"],
    },
}
SYNTH_SEED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"turns": _TURNS_SCHEMA},
    "required": ["turns"],
}
SYNTH_PREQUEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "gap_to_next": {"type": "string", "description": "time until the next session, e.g. '3 days'"},
        "turns": _TURNS_SCHEMA,
    },
    "required": ["gap_to_next", "turns"],
}
SYNTH_SEQUEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "gap_since_previous": {"type": "string", "description": "time since the previous session, e.g. '3 days'"},
        "turns": _TURNS_SCHEMA,
    },
    "required": ["gap_since_previous", "turns"],
}
SYNTH_ANNOTATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "labels": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "turn": {"type": "integer", "minimum": 0},
                    "gain": {"type": "number", "minimum": 0, "maximum": 1},
                    "needs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "session": {"type": "integer", "minimum": 0},
                                "turn": {"type": "integer", "minimum": 0},
                            },
                            "required": ["session", "turn"],
                        },
                    },
                },
                "required": ["turn", "gain", "needs"],
            },
        }
    },
    "required": ["labels"],
}

SYNTH_SYSTEM = (
    "You write realistic multi-session conversations between one user and an AI assistant, and label them, to "
    "train the assistant's long-term memory. You answer in JSON only. " + DATA_NOTE
)
SYNTH_SEED_INSTRUCTION = (
    "Write one conversation session between the user and the assistant. In it the user asks for help with "
    "everyday things whose best answer depends on the lasting constraints or preferences of the user listed "
    "below, without restating them: the assistant is expected to remember them from earlier sessions. Add a "
    "little small talk. Alternate user and assistant turns, starting with the user, about {turns} turns in all."
)
SYNTH_PREQUEL_INSTRUCTION = (
    "Below are later sessions of the user's conversation history with the assistant (oldest first) and the "
    "lasting constraints or preferences of the user that they rely on. Write the session that took place just "
    "BEFORE the earliest session shown: it is prequel {number} of {total}, written backwards in time. Together "
    "the prequels explain where these constraints or preferences come from: the session where the user first "
    "reveals one, or an earlier state that later changes. The new session must be consistent with everything "
    "shown: it must not mention anything that happens later and must not contradict any later session. Mix in "
    "everyday small talk and other personal details. Alternate user and assistant turns, starting with the user, "
    "about {turns} turns in all. Also say how much time passed between this session and the next one shown."
)
SYNTH_OPENING_INSTRUCTION = (
    "Write the first conversation session between the user and the assistant: the user has just started "
    "talking to it. Along the way, amid everyday requests and a little small talk, the user mentions the lasting "
    "constraints or preferences listed below in their own words, as people do when they meet someone. Alternate "
    "user and assistant turns, starting with the user, about {turns} turns in all."
)
SYNTH_SEQUEL_INSTRUCTION = (
    "Below are the sessions of the user's conversation history with the assistant so far (oldest first) and "
    "lasting constraints or preferences of the user. Write the NEXT session, the one that follows the latest "
    "session shown: it is session {number} of {total}, written forwards in time. Continue the user's life "
    "naturally: they may share new personal details, mention that something has changed, or come back to "
    "something said earlier, as a real conversation would; nothing has to lead anywhere in particular. The new "
    "session must be consistent with everything shown. Mix in everyday small talk. Alternate user and "
    "assistant turns, starting with the user, about {turns} turns in all. Also say how much time passed since "
    "the previous session shown."
)
SYNTH_ANNOTATE_INSTRUCTION = (
    "Walk forward through the conversation. Earlier sessions and the current session are shown with turn ids "
    "[session.turn]. For every USER turn of the current session give:\n"
    "- gain: the information gain of remembering this turn, from 0 to 1. 1 = it reveals specific, lasting "
    "personal information that is new at this point (identity, family, work, health, diet, pets, strong likes "
    "or dislikes, plans, or a change of any of these); 0 = small talk, passing moods, requests, questions, or "
    "information already stated in an earlier turn;\n"
    "- needs: the earlier turns (from earlier sessions or earlier in this session) that a good reply to this "
    "turn must use, as {{\"session\": s, \"turn\": t}}; empty when none is needed. When a fact changed, point at "
    "the turn that states its current value."
)


_NO_FACTS_BACKWARD = ("- (none listed: those the later sessions rely on; if they rely on none, invent one "
                      "plausible constraint)")
_NO_FACTS_FORWARD = ("- (none listed: those the sessions so far reveal; if they reveal none, invent one "
                     "plausible constraint)")


def _facts_block(facts: Sequence[str], none: str = _NO_FACTS_BACKWARD) -> str:
    """The user's facts as a quoted <facts> list, or the instruction `none` when there are none."""
    return quote("facts", "\n".join(f"- {f}" for f in facts)) if facts else none


def _first_session_request(instruction: str, facts: Sequence[str], none: str, task: str, *, temperature: float,
                           max_output_tokens: int, metadata: Mapping[str, Any] | None) -> LLMRequest:
    """A request for one session written from the user's constraints alone (a seed or an opening session)."""
    prompt = (
        f"{instruction}\n\nThe user's constraints or preferences:\n{_facts_block(facts, none)}\n\n"
        'Answer with a JSON object: {"turns": [{"speaker": "user" or "assistant", "text": "..."}, ...]}.'
    )
    return LLMRequest(
        prompt=prompt,
        system=SYNTH_SYSTEM,
        json_schema=SYNTH_SEED_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        task=task,
        metadata=merge_metadata({"facts": list(facts)}, metadata),
    )


def synthesis_seed_request(
    facts: Sequence[str],
    *,
    turns: int = 8,
    temperature: float = 0.7,
    max_output_tokens: int = 2048,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for a seed session whose requests depend on the user's constraints/preferences `facts`."""
    return _first_session_request(SYNTH_SEED_INSTRUCTION.format(turns=turns), facts, _NO_FACTS_BACKWARD,
                                  TASK_SYNTH_SEED, temperature=temperature, max_output_tokens=max_output_tokens,
                                  metadata=metadata)


def synthesis_prequel_request(
    facts: Sequence[str],
    later_sessions: Sequence[tuple[str | None, Dialogue]],
    *,
    number: int,
    total: int,
    turns: int = 8,
    temperature: float = 0.7,
    max_output_tokens: int = 2048,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for the session just before `later_sessions` ((gap text, dialogue) pairs, oldest first)."""
    shown = "\n\n".join(format_session_block(i + 1, gap if i else None, d, ids=False, quoted=True)
                        for i, (gap, d) in enumerate(later_sessions))
    prompt = (
        f"{SYNTH_PREQUEL_INSTRUCTION.format(number=number, total=total, turns=turns)}\n\n"
        f"The user's constraints or preferences:\n{_facts_block(facts)}\n\nLater sessions (oldest first):\n{shown}\n\n"
        'Answer with a JSON object: {"gap_to_next": "e.g. 3 days", "turns": [{"speaker": "user" or "assistant", '
        '"text": "..."}, ...]}.'
    )
    return LLMRequest(
        prompt=prompt,
        system=SYNTH_SYSTEM,
        json_schema=SYNTH_PREQUEL_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        task=TASK_SYNTH_PREQUEL,
        metadata=merge_metadata({"facts": list(facts), "prequel": number - 1, "num_prequels": total}, metadata),
    )


def synthesis_opening_request(
    facts: Sequence[str],
    *,
    turns: int = 8,
    temperature: float = 0.7,
    max_output_tokens: int = 2048,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for the first session of a forward storyline, in which the user reveals the constraints `facts`."""
    return _first_session_request(SYNTH_OPENING_INSTRUCTION.format(turns=turns), facts, _NO_FACTS_FORWARD,
                                  TASK_SYNTH_OPENING, temperature=temperature, max_output_tokens=max_output_tokens,
                                  metadata=metadata)


def synthesis_sequel_request(
    facts: Sequence[str],
    earlier_sessions: Sequence[tuple[str | None, Dialogue]],
    *,
    total: int,
    turns: int = 8,
    temperature: float = 0.7,
    max_output_tokens: int = 2048,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for the session just after `earlier_sessions` ((gap text, dialogue) pairs, oldest first, at least the
    opening one): session len(earlier_sessions) (0-based) of `total`, written knowing only what came before."""
    if not 1 <= len(earlier_sessions) < total:
        raise ValueError(f"synthesis_sequel_request: {len(earlier_sessions)} earlier sessions, need 1..{total - 1}")
    shown = "\n\n".join(format_session_block(i + 1, gap if i else None, d, ids=False, quoted=True)
                        for i, (gap, d) in enumerate(earlier_sessions))
    number = len(earlier_sessions) + 1
    prompt = (
        f"{SYNTH_SEQUEL_INSTRUCTION.format(number=number, total=total, turns=turns)}\n\n"
        f"The user's constraints or preferences:\n{_facts_block(facts, _NO_FACTS_FORWARD)}\n\n"
        f"Sessions so far (oldest first):\n{shown}\n\n"
        'Answer with a JSON object: {"gap_since_previous": "e.g. 3 days", "turns": [{"speaker": "user" or '
        '"assistant", "text": "..."}, ...]}.'
    )
    return LLMRequest(
        prompt=prompt,
        system=SYNTH_SYSTEM,
        json_schema=SYNTH_SEQUEL_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        task=TASK_SYNTH_SEQUEL,
        metadata=merge_metadata({"facts": list(facts), "session": number - 1, "num_sessions": total,
                      "sessions": [[list(t) for t in d] for _, d in earlier_sessions]}, metadata),
    )


def synthesis_annotate_request(
    sessions: Sequence[tuple[str | None, Dialogue]],
    current: int,
    *,
    max_output_tokens: int = 2048,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for gain / needs labels of the user turns of session `current`, given sessions 0..current (oldest first)."""
    if not 0 <= current < len(sessions):
        raise ValueError(f"synthesis_annotate_request: current session {current} not in 0..{len(sessions) - 1}")
    earlier = "\n\n".join(format_session_block(i, gap, d, ids=True, quoted=True)
                          for i, (gap, d) in enumerate(sessions[:current]))
    gap, dialogue = sessions[current]
    prompt = (
        f"{SYNTH_ANNOTATE_INSTRUCTION}\n\nEarlier sessions:\n{earlier or '(none)'}\n\n"
        f"Current session:\n{format_session_block(current, gap, dialogue, ids=True, quoted=True)}\n\n"
        'Answer with a JSON object: {"labels": [{"turn": t, "gain": g, "needs": [{"session": s, "turn": t}, ...]}, '
        "...]} with exactly one entry per user turn of the current session (t = its turn number)."
    )
    return LLMRequest(
        prompt=prompt,
        system=SYNTH_SYSTEM,
        json_schema=SYNTH_ANNOTATE_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=0.0,
        task=TASK_SYNTH_ANNOTATE,
        metadata=merge_metadata({"session": current, "sessions": [[list(t) for t in d] for _, d in sessions]}, metadata),
    )


def synthesis_retry_request(request: LLMRequest, error: str, attempt: int) -> LLMRequest:
    """The same request again after an unusable answer, told what was wrong (`metadata['attempt']` = attempt)."""
    prompt = (
        f"{request.prompt}\n\nYour previous answer could not be used ({neutralise(error)}). Answer again with the "
        "JSON object only, following the format exactly."
    )
    return dataclasses.replace(request, prompt=prompt, metadata=merge_metadata(request.metadata, {"attempt": attempt}))
