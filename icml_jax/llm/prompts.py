"""Every prompt the back ends see (condensation, reply generation, proxy judge, quality judge, and the
Retrospective Session Synthesis writers and annotator), in one place.

A dialogue is a sequence of (speaker, text) pairs, so this module does not depend on the data schema.
Each builder returns an LLMRequest whose `metadata` carries the structured inputs (and labels, when the caller
has them) that the offline back end reads instead of parsing the prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm.types import (
    TASK_CONDENSE,
    TASK_PAIRWISE_JUDGE,
    TASK_PROXY_JUDGE,
    TASK_QUALITY_JUDGE,
    TASK_REPLY,
    LLMRequest,
)

Dialogue = Sequence[tuple[str, str]]

QUALITY_DIMENSIONS: tuple[str, ...] = ("engagingness", "humanness", "coherence", "consistency", "memorability")

PROXY_JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "one short sentence"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["reason", "score"],
}

QUALITY_JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "one short sentence"},
        **{d: {"type": "integer", "minimum": 1, "maximum": 5} for d in QUALITY_DIMENSIONS},
    },
    "required": ["reason", *QUALITY_DIMENSIONS],
}

CONDENSE_SYSTEM = (
    "You maintain a long-term memory about a user for a conversational assistant. "
    "You write short, factual notes in the third person."
)
CONDENSE_INSTRUCTION = (
    "Write one short note (at most two sentences, third person, e.g. 'The user has a dog named Max.') stating "
    "what the user's turn below reveals about the user that could matter in later conversations. Keep names, "
    "dates and numbers exactly. Output only the note."
)

REPLY_SYSTEM = (
    "You are a warm, attentive conversational partner in a long-term conversation with the same user over many "
    "sessions. Reply naturally in one to three sentences."
)
REPLY_INSTRUCTION = (
    "Write the assistant's next reply to the user's last message. If a memory is given and it is relevant, use it "
    "naturally and accurately; never invent past events that are not in the memory or the dialogue. Output only "
    "the reply text."
)

PROXY_SYSTEM = "You are a careful judge of conversations. You answer in JSON only."
PROXY_INSTRUCTION = (
    "Rate the information value of the user's turn below: how useful would it be for the assistant to remember it "
    "in later sessions with this user? 0 = nothing worth remembering (greetings, small talk, generic questions); "
    "0.5 = mildly useful or short-lived details; 1 = specific, lasting personal information (identity, family, "
    "work, health, strong preferences, plans, important events). Answer with a JSON object: "
    '{"reason": one short sentence, "score": a number between 0 and 1}.'
)

QUALITY_SYSTEM = "You are a careful judge of conversations. You answer in JSON only."
QUALITY_INSTRUCTION = (
    "Rate the assistant's reply on five dimensions, each an integer from 1 (poor) to 5 (excellent):\n"
    "- engagingness: is it interesting and does it invite the user to continue?\n"
    "- humanness: does it sound like a natural human conversational partner?\n"
    "- coherence: does it follow sensibly from the dialogue and the user's last message?\n"
    "- consistency: does it agree with the dialogue and with what is known about the user?\n"
    "- memorability: does it correctly recall and use relevant information from past sessions when that helps "
    "(a reply that needed no memory and used none is a 3)?\n"
    'Answer with a JSON object: {"reason": one short sentence, "engagingness": n, "humanness": n, '
    '"coherence": n, "consistency": n, "memorability": n}.'
)


def format_dialogue(history: Dialogue, max_turns: int | None = None) -> str:
    """Render (speaker, text) pairs as 'Speaker: text' lines, keeping the last `max_turns`."""
    turns = list(history)
    if max_turns is not None:
        turns = turns[-max_turns:] if max_turns > 0 else []
    if not turns:
        return "(no earlier dialogue)"
    return "\n".join(f"{speaker}: {text}" for speaker, text in turns)


def _md(base: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(base)
    if extra:
        out.update(extra)
    return out


def condense_request(
    turn_text: str,
    history: Dialogue = (),
    *,
    speaker: str = "User",
    max_history_turns: int = 4,
    max_output_tokens: int = 128,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for a short third-person note about the user from one saved turn."""
    prompt = (
        f"{CONDENSE_INSTRUCTION}\n\nRecent dialogue:\n{format_dialogue(history, max_history_turns)}\n\n"
        f"The user's turn:\n{speaker}: {turn_text}\n\nNote:"
    )
    return LLMRequest(
        prompt=prompt,
        system=CONDENSE_SYSTEM,
        max_output_tokens=max_output_tokens,
        task=TASK_CONDENSE,
        metadata=_md({"turn_text": turn_text}, metadata),
    )


def reply_request(
    history: Dialogue,
    utterance: str,
    memory: str | None,
    *,
    user_speaker: str = "User",
    max_history_turns: int = 8,
    max_output_tokens: int = 256,
    temperature: float = 0.7,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for the reply r* from the recent dialogue, the utterance and the chosen memory (None = no memory)."""
    memory_block = memory.strip() if memory else "(none)"
    prompt = (
        f"{REPLY_INSTRUCTION}\n\nMemory about the user from earlier sessions:\n{memory_block}\n\n"
        f"Recent dialogue:\n{format_dialogue(history, max_history_turns)}\n\n"
        f"{user_speaker}: {utterance}\nAssistant:"
    )
    return LLMRequest(
        prompt=prompt,
        system=REPLY_SYSTEM,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        task=TASK_REPLY,
        metadata=_md({"utterance": utterance, "memory": memory}, metadata),
    )


def proxy_judge_request(
    turn_text: str,
    history: Dialogue = (),
    *,
    label: float | None = None,
    max_history_turns: int = 4,
    max_output_tokens: int = 1024,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for the information value in [0, 1] of a user turn (the proxy reward r_proxy)."""
    prompt = (
        f"{PROXY_INSTRUCTION}\n\nRecent dialogue:\n{format_dialogue(history, max_history_turns)}\n\n"
        f"The user's turn to rate:\nUser: {turn_text}"
    )
    base: dict[str, Any] = {"turn_text": turn_text}
    if label is not None:
        base["label"] = float(label)
    return LLMRequest(
        prompt=prompt,
        system=PROXY_SYSTEM,
        json_schema=PROXY_JUDGE_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=0.0,
        task=TASK_PROXY_JUDGE,
        metadata=_md(base, metadata),
    )


def quality_judge_request(
    history: Dialogue,
    utterance: str,
    reply: str,
    memory: str | None,
    *,
    label_needed: Sequence[Any] | None = None,
    used_ref: Any = None,
    max_history_turns: int = 8,
    max_output_tokens: int = 1024,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask for 1-5 scores of a reply on the five quality dimensions (the quality reward r_qual)."""
    memory_block = memory.strip() if memory else "(none)"
    prompt = (
        f"{QUALITY_INSTRUCTION}\n\nMemory the assistant was given about the user:\n{memory_block}\n\n"
        f"Recent dialogue:\n{format_dialogue(history, max_history_turns)}\n\n"
        f"User: {utterance}\nAssistant (the reply to rate): {reply}"
    )
    base: dict[str, Any] = {"utterance": utterance, "reply": reply, "memory": memory}
    if label_needed is not None:
        base["label_needed"] = list(label_needed)
        base["used_ref"] = used_ref
    return LLMRequest(
        prompt=prompt,
        system=QUALITY_SYSTEM,
        json_schema=QUALITY_JUDGE_SCHEMA,
        max_output_tokens=max_output_tokens,
        temperature=0.0,
        task=TASK_QUALITY_JUDGE,
        metadata=_md(base, metadata),
    )


PAIRWISE_JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "one short sentence"},
        "better": {"type": "string", "enum": ["1", "2", "tie"]},
    },
    "required": ["reason", "better"],
}
PAIRWISE_INSTRUCTION = (
    "Two candidate replies of an assistant to the same user message follow, each with the memory about the user "
    "it was given. Judge which reply is better overall: engaging, human, coherent, consistent with the dialogue "
    "and with what is known about the user, and using past information correctly when it helps. Answer with a "
    'JSON object: {"reason": one short sentence, "better": "1", "2" or "tie"}.'
)


def pairwise_judge_request(
    history: Dialogue,
    utterance: str,
    first: tuple[str, str | None],
    second: tuple[str, str | None],
    *,
    max_history_turns: int = 8,
    max_output_tokens: int = 512,
    metadata: Mapping[str, Any] | None = None,
) -> LLMRequest:
    """Ask which of two (reply, memory) pairs answers `utterance` better; they are shown as "1" and "2" only,
    in the order given (callers randomize it), never with the systems' names."""
    blocks = []
    for i, (reply, memory) in enumerate((first, second), start=1):
        blocks.append(f"Reply {i} (memory given: {memory.strip() if memory else '(none)'}):\n{reply}")
    prompt = (f"{PAIRWISE_INSTRUCTION}\n\nRecent dialogue:\n{format_dialogue(history, max_history_turns)}\n\n"
              f"User: {utterance}\n\n" + "\n\n".join(blocks))
    base = {"utterance": utterance, "replies": [first[0], second[0]], "memories": [first[1], second[1]]}
    return LLMRequest(prompt=prompt, system=QUALITY_SYSTEM, json_schema=PAIRWISE_JUDGE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_PAIRWISE_JUDGE,
                      metadata=_md(base, metadata))


# --- Retrospective Session Synthesis (cold start): seed sessions, backward prequels, forward annotation, and
# the forward generation it is compared with (an opening session, then sequels in time order). ---

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
    "train the assistant's long-term memory. You answer in JSON only."
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


def format_session_block(index: int, gap_text: str | None, turns: Dialogue, *, ids: bool) -> str:
    """One session as text: a header with its index and gap, then 'Speaker: text' (or '[s.t] Speaker: text')."""
    gap = f" ({gap_text} after the previous session)" if gap_text else ""
    lines = [f"[{index}.{t}] {speaker}: {text}" if ids else f"{speaker}: {text}" for t, (speaker, text) in
             enumerate(turns)]
    return f"Session {index}{gap}:\n" + ("\n".join(lines) if lines else "(empty)")


_NO_FACTS_BACKWARD = ("- (none listed: those the later sessions rely on; if they rely on none, invent one "
                      "plausible constraint)")
_NO_FACTS_FORWARD = ("- (none listed: those the sessions so far reveal; if they reveal none, invent one "
                     "plausible constraint)")


def _facts_block(facts: Sequence[str], none: str = _NO_FACTS_BACKWARD) -> str:
    return "\n".join(f"- {f}" for f in facts) if facts else none


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
        metadata=_md({"facts": list(facts)}, metadata),
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
    shown = "\n\n".join(format_session_block(i + 1, gap if i else None, d, ids=False)
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
        metadata=_md({"facts": list(facts), "prequel": number - 1, "num_prequels": total}, metadata),
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
    shown = "\n\n".join(format_session_block(i + 1, gap if i else None, d, ids=False)
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
        metadata=_md({"facts": list(facts), "session": number - 1, "num_sessions": total,
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
    earlier = "\n\n".join(format_session_block(i, gap, d, ids=True) for i, (gap, d) in enumerate(sessions[:current]))
    gap, dialogue = sessions[current]
    prompt = (
        f"{SYNTH_ANNOTATE_INSTRUCTION}\n\nEarlier sessions:\n{earlier or '(none)'}\n\n"
        f"Current session:\n{format_session_block(current, gap, dialogue, ids=True)}\n\n"
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
        metadata=_md({"session": current, "sessions": [[list(t) for t in d] for _, d in sessions]}, metadata),
    )


def synthesis_retry_request(request: LLMRequest, error: str, attempt: int) -> LLMRequest:
    """The same request again after an unusable answer, told what was wrong (`metadata['attempt']` = attempt)."""
    prompt = (
        f"{request.prompt}\n\nYour previous answer could not be used ({error}). Answer again with the JSON object "
        "only, following the format exactly."
    )
    return dataclasses.replace(request, prompt=prompt, metadata=_md(request.metadata, {"attempt": attempt}))
