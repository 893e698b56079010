"""Every prompt the back ends see (condensation, reply generation, proxy judge, quality judge), in one place.

A dialogue is a sequence of (speaker, text) pairs, so this module does not depend on the data schema.
Each builder returns an LLMRequest whose `metadata` carries the structured inputs (and labels, when the caller
has them) that the offline back end reads instead of parsing the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm.types import TASK_CONDENSE, TASK_PROXY_JUDGE, TASK_QUALITY_JUDGE, TASK_REPLY, LLMRequest

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
