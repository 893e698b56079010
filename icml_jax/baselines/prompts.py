"""The baselines' own LLM requests: a session summary and fact extraction (MemoryBank), fact extraction and
the memory-update decision (Mem0); both speakers' personas (LD-Agent); note construction and evolution (A-Mem);
the promotion of a hot segment (MemoryOS); relation links and timeline refinement (THEANINE); Table 6's memory
methods: the running summary update (Rsum), the session memory and its compression (COMEDY), memo writing and
memo retrieval (MemoChat). Each has its task name, so the offline back end answers it
(`icml_jax.baselines.offline_answers`), and carries its structured inputs in `metadata` (never labels)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm.jsonparse import parse_json_text
from icml_jax.llm.prompts import DATA_NOTE, Dialogue, dialogue_block, quote
from icml_jax.llm.types import LLMRequest, LLMResponse

TASK_SUMMARIZE = "baseline_summarize"
TASK_EXTRACT_FACTS = "baseline_extract_facts"
TASK_MEM0_DECIDE = "baseline_mem0_decide"
BASELINE_TASKS: tuple[str, ...] = (TASK_SUMMARIZE, TASK_EXTRACT_FACTS, TASK_MEM0_DECIDE)
MEM0_EVENTS: tuple[str, ...] = ("ADD", "UPDATE", "DELETE", "NOOP")

MEMORY_SYSTEM = ("You keep the long-term memory of a conversational assistant about one user across many "
                 "sessions. You are brief and factual and never invent anything. " + DATA_NOTE)
JSON_SYSTEM = MEMORY_SYSTEM + " You answer in JSON only."

SUMMARIZE_INSTRUCTION = (
    "Summarize the conversation session below for the assistant's memory in at most three sentences: what was "
    "talked about and everything the user revealed about themselves that could matter in later sessions. Keep "
    "names, dates and numbers exactly. Output only the summary.")
FACTS_INSTRUCTION = (
    "List the facts about the user that the turns marked USER reveal: lasting personal information (identity, "
    "home, family, work, health, diet, pets, strong preferences, plans) or a change of it, each as one short "
    "self-contained sentence, with the id of the turn it comes from; at most {max_facts} facts. Small talk, "
    "passing moods, requests and questions are not facts. Answer with a JSON object: "
    '{{"facts": [{{"turn": id, "fact": "..."}}, ...]}}, with an empty list when there is no fact.')
DECIDE_INSTRUCTION = (
    "A new fact about the user and the most similar memories already stored (each with its id attribute) "
    "follow. Decide how "
    "the memory changes: ADD when the fact is new information; UPDATE when it changes or refines a stored "
    "memory (give that memory's id and the updated text, keeping what is still true); DELETE when it says that "
    "a stored memory is no longer true and nothing replaces it (give its id); NOOP when the memory already "
    'holds it. Answer with a JSON object: {"event": "ADD" | "UPDATE" | "DELETE" | "NOOP", "id": the memory id '
    '(UPDATE and DELETE) or "", "text": the memory text to store (ADD and UPDATE) or ""}.')

FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"turn": {"type": "integer", "minimum": 0}, "fact": {"type": "string"}},
                "required": ["turn", "fact"],
            },
        },
    },
    "required": ["facts"],
}
DECIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": list(MEM0_EVENTS)},
        "id": {"type": "string"},
        "text": {"type": "string"},
    },
    "required": ["event", "id", "text"],
}

Turns = Sequence[tuple[int, str, str, bool]]  # (turn index in its session, speaker, text, is the user's)


def _turn_lines(turns: Turns) -> str:
    """The turns, one line each with its id, quoted as one <dialogue> block (user text is data)."""
    if not turns:
        return "(empty)"
    return quote("dialogue", "\n".join(f"[{t}] {'USER ' if user else ''}{speaker}: {text}"
                                      for t, speaker, text, user in turns))


def _turns_md(turns: Turns) -> list[dict[str, Any]]:
    return [{"turn": int(t), "speaker": speaker, "text": text, "user": bool(user)} for t, speaker, text, user in turns]


def summarize_request(turns: Turns, *, session: int, max_output_tokens: int = 192,
                      metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for a short summary of one finished session (MemoryBank's per-session event summary)."""
    prompt = f"{SUMMARIZE_INSTRUCTION}\n\nSession {session + 1}:\n{_turn_lines(turns)}\n\nSummary:"
    return LLMRequest(prompt=prompt, system=MEMORY_SYSTEM, max_output_tokens=max_output_tokens, temperature=0.0,
                      task=TASK_SUMMARIZE,
                      metadata={"session": int(session), "turns": _turns_md(turns), **dict(metadata or {})})


def extract_facts_request(turns: Turns, *, context: Dialogue = (), max_facts: int = 5,
                          max_output_tokens: int = 512, metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the facts about the user in `turns` (its USER ones), each with its turn id; `context` is dialogue
    shown before them that facts are not taken from (Mem0 reads a turn with its recent history)."""
    shown = f"Earlier dialogue (context only):\n{dialogue_block(context, 4)}\n\n" if context else ""
    prompt = f"{FACTS_INSTRUCTION.format(max_facts=max_facts)}\n\n{shown}Turns:\n{_turn_lines(turns)}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=FACTS_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_EXTRACT_FACTS,
                      metadata={"turns": _turns_md(turns), "max_facts": int(max_facts), **dict(metadata or {})})


def mem0_decide_request(fact: str, memories: Sequence[tuple[str, str]], *, max_output_tokens: int = 256,
                        metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask which memory event a new `fact` causes among the most similar stored `memories` ((id, text) pairs)."""
    listed = ("\n".join(quote("memory", text, id=str(i)) for i, text in memories) if memories
              else "(no memories stored yet)")
    prompt = f"{DECIDE_INSTRUCTION}\n\nStored memories:\n{listed}\n\nNew fact:\n{quote('memory', fact)}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=DECIDE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_MEM0_DECIDE,
                      metadata={"fact": fact, "memories": [{"id": i, "text": text} for i, text in memories],
                                **dict(metadata or {})})




def _value(response: LLMResponse) -> tuple[Any | None, str | None]:
    """The response's JSON: parsed by the back end when it was asked for a schema, else parsed here."""
    if response.parsed is not None:
        return response.parsed, None
    return parse_json_text(response.text)


def parse_facts(response: LLMResponse) -> tuple[list[tuple[int | None, str]] | None, str | None]:
    """(facts as (turn id or None, text), problem): leniently, {"facts": [...]} or a bare list whose items are
    {"turn", "fact"} objects or strings. facts is None when the answer is unusable; a problem with facts means
    some items were left out (or had no usable turn id)."""
    value, error = _value(response)
    if error is not None:
        return None, error
    items = value.get("facts") if isinstance(value, dict) else value
    if not isinstance(items, list):
        return None, f"expected a list of facts, got {type(items).__name__}"
    facts, problems = turn_items(items, "fact")
    return facts, "; ".join(problems) or None


def parse_decision(response: LLMResponse, ids: Sequence[str]) -> tuple[tuple[str, str | None, str] | None, str | None]:
    """((event, memory id or None, text), None), or (None, why) when the answer is not a usable Mem0 event: an
    unknown event, or UPDATE / DELETE of an id that was not shown. UPDATE with an empty text is an error too."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    event = str(value.get("event", "")).strip().upper()
    if event not in MEM0_EVENTS:
        return None, f"unknown event {value.get('event')!r}"
    memory_id = value.get("id")
    memory_id = None if memory_id is None or str(memory_id).strip() == "" else str(memory_id).strip()
    text = " ".join(str(value.get("text") or "").split())
    if event in ("UPDATE", "DELETE") and memory_id not in ids:
        return None, f"{event} of memory id {memory_id!r}, not one of those shown {list(ids)}"
    if event == "UPDATE" and not text:
        return None, "UPDATE without a text"
    return (event, memory_id, text), None


__all__ = ["BASELINE_TASKS", "DECIDE_SCHEMA", "FACTS_SCHEMA", "MEM0_EVENTS", "TASK_EXTRACT_FACTS",
           "TASK_MEM0_DECIDE", "TASK_SUMMARIZE", "Turns", "extract_facts_request", "mem0_decide_request",
           "parse_decision", "parse_facts", "summarize_request"]


# -- LD-Agent (icml_jax.baselines.ld_agent): persona extraction for both speakers ------------------------------

TASK_LD_PERSONA = "baseline_ld_persona"
PERSONA_SPEAKERS: tuple[str, ...] = ("user", "agent")
PERSONA_INSTRUCTION = (
    "List the lasting traits of each speaker of the session below: the user's (turns marked USER) and the "
    "assistant's (the other turns): personality, background, preferences, habits, each as one short "
    "self-contained sentence with the id of the turn it comes from; at most {max_traits} per speaker. Passing "
    "moods, requests and questions are not traits. Answer with a JSON object: "
    '{{"user": [{{"turn": id, "trait": "..."}}, ...], "agent": [{{"turn": id, "trait": "..."}}, ...]}}, with '
    "empty lists when there is none.")
_TRAITS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"type": "object", "properties": {"turn": {"type": "integer", "minimum": 0},
                                               "trait": {"type": "string"}}, "required": ["turn", "trait"]},
}
PERSONA_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {s: _TRAITS_SCHEMA for s in PERSONA_SPEAKERS}, "required": list(PERSONA_SPEAKERS)}


def ld_persona_request(turns: Turns, *, max_traits: int = 5, max_output_tokens: int = 256,
                       metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for both speakers' persona traits in one finished session (LD-Agent's persona extractor)."""
    prompt = f"{PERSONA_INSTRUCTION.format(max_traits=max_traits)}\n\nSession:\n{_turn_lines(turns)}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=PERSONA_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_LD_PERSONA,
                      metadata={"turns": _turns_md(turns), "max_traits": int(max_traits), **dict(metadata or {})})


def turn_items(items: Any, key: str) -> tuple[list[tuple[int | None, str]] | None, list[str]]:
    """(items as (turn id or None, text), problems) from a JSON list of {"turn", key} objects or strings; None
    when `items` is not a list. Items without a text are left out, items without a usable turn id keep None."""
    if not isinstance(items, list):
        return None, [f"expected a list, got {type(items).__name__}"]
    out, problems = [], []
    for item in items:
        text = item.get(key) if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            problems.append(f"item without a {key} text: {item!r}"[:120])
            continue
        turn = item.get("turn") if isinstance(item, dict) else None
        if isinstance(turn, str) and turn.strip().isdigit():
            turn = int(turn)
        if not isinstance(turn, int) or isinstance(turn, bool):
            problems.append(f"{key} without a turn id: {text[:60]!r}")
            turn = None
        out.append((turn, " ".join(text.split())))
    return out, problems


def parse_personas(response: LLMResponse) -> tuple[dict[str, list[tuple[int | None, str]]] | None, str | None]:
    """({"user": traits, "agent": traits}, problem), each trait (turn id or None, text); None when the answer is
    not a JSON object; a speaker whose list is missing or unusable gets no traits and a problem."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    out, problems = {}, []
    for speaker in PERSONA_SPEAKERS:
        traits, why = turn_items(value.get(speaker, []), "trait")
        out[speaker] = traits or []
        problems += [f"{speaker}: {p}" for p in why]
    return out, "; ".join(problems) or None


BASELINE_TASKS += (TASK_LD_PERSONA,)
__all__ += ["PERSONA_SCHEMA", "PERSONA_SPEAKERS", "TASK_LD_PERSONA", "ld_persona_request", "parse_personas",
            "turn_items"]


# -- A-Mem (icml_jax.baselines.a_mem): note construction and memory evolution -----------------------------------

TASK_AMEM_NOTE = "baseline_amem_note"
TASK_AMEM_EVOLVE = "baseline_amem_evolve"
AMEM_NOTE_INSTRUCTION = (
    "The user's turn below may be worth a note in the assistant's long-term memory. Decide whether it is (keep "
    "is false for small talk, passing moods, requests and questions that reveal nothing lasting) and describe it "
    "as a note: at most {max_keywords} keywords (the turn's most important words), a few category tags, and a "
    "one-sentence context saying what the turn is about and why it matters. Answer with a JSON object: "
    '{{"keep": true | false, "keywords": ["..."], "tags": ["..."], "context": "..."}}.')
AMEM_EVOLVE_INSTRUCTION = (
    "A new note of the assistant's memory about the user and the most similar stored notes (each with its id "
    "attribute) follow. Decide which stored notes the new note should link to (those about a related matter), "
    "and whether any linked note should evolve in the light of the new one: a new context sentence and/or new "
    'tags for it. Answer with a JSON object: {"links": [ids], "updates": [{"id": id, "context": "new context or '
    'empty to keep it", "tags": ["new tags"] or [] to keep them}]}, with empty lists when nothing changes.')
AMEM_NOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"keep": {"type": "boolean"}, "keywords": {"type": "array", "items": {"type": "string"}},
                   "tags": {"type": "array", "items": {"type": "string"}}, "context": {"type": "string"}},
    "required": ["keep", "keywords", "tags", "context"],
}
AMEM_EVOLVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "links": {"type": "array", "items": {"type": "string"}},
        "updates": {"type": "array", "items": {
            "type": "object", "properties": {"id": {"type": "string"}, "context": {"type": "string"},
                                             "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["id", "context", "tags"]}},
    },
    "required": ["links", "updates"],
}


@dataclasses.dataclass(frozen=True)
class NoteFields:
    """What an A-Mem note holds besides its content (the turn): keywords, tags and a context sentence."""

    keywords: tuple[str, ...]
    tags: tuple[str, ...]
    context: str

    def render(self, content: str) -> str:
        """The note as the evolution prompt shows it."""
        return (f"{content}\nkeywords: {', '.join(self.keywords) or '-'}\ntags: {', '.join(self.tags) or '-'}\n"
                f"context: {self.context or '-'}")

    def as_dict(self) -> dict[str, Any]:
        return {"keywords": list(self.keywords), "tags": list(self.tags), "context": self.context}


def amem_note_request(text: str, *, context: Dialogue = (), max_keywords: int = 5, max_output_tokens: int = 256,
                      metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask whether one user turn becomes a note and for its keywords, tags and context (A-Mem's note
    construction); `context` is the recent dialogue before it."""
    shown = f"Earlier dialogue (context only):\n{dialogue_block(context, 4)}\n\n" if context else ""
    prompt = (f"{AMEM_NOTE_INSTRUCTION.format(max_keywords=max_keywords)}\n\n{shown}User turn:\n"
              f"{quote('dialogue', text)}")
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=AMEM_NOTE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_AMEM_NOTE,
                      metadata={"text": text, "max_keywords": int(max_keywords), **dict(metadata or {})})


def amem_evolve_request(content: str, note: NoteFields, neighbours: Sequence[tuple[str, str, NoteFields]], *,
                        max_output_tokens: int = 256, metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask which of the shown `neighbours` ((id, content, fields)) a new note links to and how they evolve."""
    listed = "\n".join(quote("memory", f.render(c), id=i) for i, c, f in neighbours)
    new = quote("memory", note.render(content))
    prompt = f"{AMEM_EVOLVE_INSTRUCTION}\n\nStored notes:\n{listed}\n\nNew note:\n{new}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=AMEM_EVOLVE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_AMEM_EVOLVE,
                      metadata={"note": {"content": content, **note.as_dict()},
                                "neighbours": [{"id": i, "content": c, **f.as_dict()} for i, c, f in neighbours],
                                **dict(metadata or {})})


def _strings(value: Any, what: str, problems: list[str]) -> tuple[str, ...]:
    """A JSON list of strings as a tuple of cleaned, distinct, non-empty strings; anything else is a problem."""
    if not isinstance(value, list):
        problems.append(f"{what}: expected a list, got {type(value).__name__}")
        return ()
    if not all(isinstance(v, str) for v in value):
        problems.append(f"{what}: items that are not strings left out")
    return tuple(dict.fromkeys(" ".join(v.split()) for v in value if isinstance(v, str) and v.strip()))


def parse_note(response: LLMResponse) -> tuple[tuple[bool, NoteFields] | None, str | None]:
    """((keep, fields), problem): None when the answer is not a JSON object; a missing or unusable keep is
    True (nothing is dropped on a bad answer), unusable keywords / tags / context are empty, each a problem."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    problems: list[str] = []
    keep = value.get("keep")
    if not isinstance(keep, bool):
        problems.append(f"keep is not a boolean: {keep!r}"[:80])
        keep = True
    keywords = _strings(value.get("keywords"), "keywords", problems)
    tags = _strings(value.get("tags"), "tags", problems)
    context = value.get("context")
    if not isinstance(context, str):
        problems.append(f"context is not a string: {context!r}"[:80])
        context = ""
    return (keep, NoteFields(keywords, tags, " ".join(context.split()))), "; ".join(problems) or None


def parse_evolution(response: LLMResponse, ids: Sequence[str]
                    ) -> tuple[tuple[list[str], dict[str, tuple[str, tuple[str, ...]]]] | None, str | None]:
    """((linked ids, {id: (new context or "", new tags or ())}), problem); None when the answer is not a JSON
    object. Ids that were not shown are left out, each a problem."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    problems: list[str] = []
    raw_links = value.get("links", [])
    if isinstance(raw_links, list):  # ids given as numbers are ids too
        raw_links = [str(i) if isinstance(i, int) and not isinstance(i, bool) else i for i in raw_links]
    links = list(_strings(raw_links, "links", problems))
    for bad in [i for i in links if i not in ids]:
        problems.append(f"link to id {bad!r}, not one of those shown {list(ids)}")
    links = list(dict.fromkeys(i for i in links if i in ids))
    updates: dict[str, tuple[str, tuple[str, ...]]] = {}
    raw = value.get("updates", [])
    if not isinstance(raw, list):
        problems.append(f"updates: expected a list, got {type(raw).__name__}")
        raw = []
    for item in raw:
        memory_id = str(item.get("id", "")).strip() if isinstance(item, dict) else None  # numbers read as ids
        if memory_id not in ids:
            problems.append(f"update of {item!r}, not one of the notes shown {list(ids)}"[:160])
            continue
        context = item.get("context") if isinstance(item.get("context"), str) else ""
        tags = _strings(item.get("tags", []), f"tags of {memory_id}", problems)
        updates[memory_id] = (" ".join(context.split()), tags)
    return (links, updates), "; ".join(problems) or None


BASELINE_TASKS += (TASK_AMEM_NOTE, TASK_AMEM_EVOLVE)
__all__ += ["AMEM_EVOLVE_SCHEMA", "AMEM_NOTE_SCHEMA", "NoteFields", "TASK_AMEM_EVOLVE", "TASK_AMEM_NOTE",
            "amem_evolve_request", "amem_note_request", "parse_evolution", "parse_note"]


# -- MemoryOS (icml_jax.baselines.memoryos): promotion of a hot mid-term segment to the persona ------------------

TASK_MEMORYOS_PROMOTE = "baseline_memoryos_promote"
MEMORYOS_PROMOTE_INSTRUCTION = (
    "The pages below are a topic segment of the assistant's memory that the user keeps coming back to, each with "
    "its id attribute, and the user profile written so far. Update the profile (a few sentences on who the user "
    "is: traits, preferences, circumstances; keep what is still true) and list the lasting facts about the user "
    "that the pages reveal, each as one short self-contained sentence with the id of the page it comes from; at "
    'most {max_facts} facts. Answer with a JSON object: {{"profile": "...", "knowledge": [{{"page": id, "fact": '
    '"..."}}, ...]}}.')
MEMORYOS_PROMOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "profile": {"type": "string"},
        "knowledge": {"type": "array", "items": {
            "type": "object", "properties": {"page": {"type": "integer", "minimum": 0}, "fact": {"type": "string"}},
            "required": ["page", "fact"]}},
    },
    "required": ["profile", "knowledge"],
}


def memoryos_promote_request(pages: Sequence[str], profile: str, *, max_facts: int = 5,
                             max_output_tokens: int = 384, metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the updated user profile and the facts of one hot segment's `pages` (their ids: list positions)."""
    listed = "\n".join(quote("memory", text, id=str(i)) for i, text in enumerate(pages))
    prompt = (f"{MEMORYOS_PROMOTE_INSTRUCTION.format(max_facts=max_facts)}\n\nUser profile so far:\n"
              f"{quote('memory', profile) if profile else '(empty)'}\n\nSegment pages:\n{listed}")
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=MEMORYOS_PROMOTE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_MEMORYOS_PROMOTE,
                      metadata={"pages": [{"id": str(i), "text": t} for i, t in enumerate(pages)],
                                "profile": profile, "max_facts": int(max_facts), **dict(metadata or {})})


def parse_promotion(response: LLMResponse) -> tuple[tuple[str, list[tuple[int | None, str]]] | None, str | None]:
    """((profile, facts as (page id or None, text)), problem); None when the answer is not a JSON object. An
    unusable profile is "" and unusable facts are none, each a problem."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    problems = []
    profile = value.get("profile")
    if not isinstance(profile, str):
        problems.append(f"profile is not a string: {profile!r}"[:80])
        profile = ""
    items = [{"turn": i.get("page"), "fact": i.get("fact")} if isinstance(i, dict) else i
             for i in value.get("knowledge", [])] if isinstance(value.get("knowledge", []), list) else None
    facts, why = turn_items(items, "fact")
    problems += [f"knowledge: {p}".replace("turn id", "page id") for p in why]
    return (" ".join(profile.split()), facts or []), "; ".join(problems) or None


BASELINE_TASKS += (TASK_MEMORYOS_PROMOTE,)
__all__ += ["MEMORYOS_PROMOTE_SCHEMA", "TASK_MEMORYOS_PROMOTE", "memoryos_promote_request", "parse_promotion"]


# -- THEANINE (icml_jax.baselines.theanine): relation links between memories and timeline refinement -------------

TASK_THEANINE_LINK = "baseline_theanine_link"
TASK_THEANINE_REFINE = "baseline_theanine_refine"
THEANINE_RELATIONS: tuple[str, ...] = ("temporal", "causal")
THEANINE_LINK_INSTRUCTION = (
    "A new memory about the user and earlier memories that may be related (each with its id attribute) follow. "
    "For each earlier memory that the new one continues, name the relation: causal when the earlier one is a "
    "cause or reason of the new one, temporal when the new one is a later development of the same matter. Leave "
    'out unrelated memories. Answer with a JSON object: {"links": [{"id": id, "relation": "causal" | '
    '"temporal"}, ...]}, with an empty list when nothing is related.')
THEANINE_REFINE_INSTRUCTION = (
    "The user's latest utterance and timelines of the assistant's memories about the user (oldest first, each "
    "step with its relation) follow. Write the compact context a reply needs: what of these timelines bears on "
    "the utterance, and how it developed over time, in at most three sentences. Keep names, dates and numbers "
    "exactly. Output only the context.")
THEANINE_LINK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"links": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "string"},
                                         "relation": {"type": "string", "enum": list(THEANINE_RELATIONS)}},
        "required": ["id", "relation"]}}},
    "required": ["links"],
}

TimelineStep = tuple[int, str, str | None]  # (session, memory text, relation to the previous step or None)


def theanine_link_request(memory: str, candidates: Sequence[tuple[str, str]], *, max_output_tokens: int = 256,
                          metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask which earlier `candidates` ((id, text)) a new memory continues, and by which relation."""
    listed = "\n".join(quote("memory", text, id=i) for i, text in candidates)
    prompt = f"{THEANINE_LINK_INSTRUCTION}\n\nEarlier memories:\n{listed}\n\nNew memory:\n{quote('memory', memory)}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=THEANINE_LINK_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_THEANINE_LINK,
                      metadata={"memory": memory, "candidates": [{"id": i, "text": t} for i, t in candidates],
                                **dict(metadata or {})})


def render_timeline(steps: Sequence[TimelineStep]) -> str:
    """A timeline as lines, oldest first: '[session n] text', later steps prefixed with their relation."""
    return "\n".join(f"{'' if rel is None else f'-> ({rel}) '}[session {s + 1}] {text}" for s, text, rel in steps)


def theanine_refine_request(utterance: str, timelines: Sequence[Sequence[TimelineStep]], *,
                            context: Dialogue = (), max_output_tokens: int = 192,
                            metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the compact context of the retrieved `timelines` for replying to `utterance`."""
    shown = "\n".join(quote("memory", render_timeline(steps), id=str(i)) for i, steps in enumerate(timelines))
    prompt = (f"{THEANINE_REFINE_INSTRUCTION}\n\nRecent dialogue:\n{dialogue_block(context, 4)}\n\nUtterance:\n"
              f"{quote('dialogue', utterance)}\n\nTimelines:\n{shown}\n\nContext:")
    return LLMRequest(prompt=prompt, system=MEMORY_SYSTEM, max_output_tokens=max_output_tokens, temperature=0.0,
                      task=TASK_THEANINE_REFINE,
                      metadata={"utterance": utterance,
                                "timelines": [[{"session": s, "text": t, "relation": r} for s, t, r in steps]
                                              for steps in timelines], **dict(metadata or {})})


def parse_links(response: LLMResponse, ids: Sequence[str]) -> tuple[list[tuple[str, str]] | None, str | None]:
    """([(candidate id, relation)], problem); None when the answer has no usable list of links. Links to ids
    not shown or with an unknown relation are left out, each a problem; an id linked twice keeps its first."""
    value, error = _value(response)
    if error is not None:
        return None, error
    items = value.get("links") if isinstance(value, dict) else value
    if not isinstance(items, list):
        return None, f"expected a list of links, got {type(items).__name__}"
    links: dict[str, str] = {}
    problems = []
    for item in items:
        memory_id = str(item.get("id", "")).strip() if isinstance(item, dict) else ""
        relation = str(item.get("relation", "")).strip().lower() if isinstance(item, dict) else ""
        if memory_id not in ids or relation not in THEANINE_RELATIONS:
            problems.append(f"link {item!r} (ids shown {list(ids)}, relations {list(THEANINE_RELATIONS)})"[:160])
            continue
        links.setdefault(memory_id, relation)
    return list(links.items()), "; ".join(problems) or None


BASELINE_TASKS += (TASK_THEANINE_LINK, TASK_THEANINE_REFINE)
__all__ += ["TASK_THEANINE_LINK", "TASK_THEANINE_REFINE", "THEANINE_LINK_SCHEMA", "THEANINE_RELATIONS",
            "TimelineStep", "parse_links", "render_timeline", "theanine_link_request", "theanine_refine_request"]


# -- Table 6's memory methods: Rsum (recursive summary), COMEDY (compressive memory), MemoChat (topic memos) ------

TASK_RSUM_UPDATE = "baseline_rsum_update"
TASK_COMEDY_SESSION = "baseline_comedy_session"
TASK_COMEDY_COMPRESS = "baseline_comedy_compress"
TASK_MEMOCHAT_WRITE = "baseline_memochat_write"
TASK_MEMOCHAT_RETRIEVE = "baseline_memochat_retrieve"
TABLE6_TASKS: tuple[str, ...] = (TASK_RSUM_UPDATE, TASK_COMEDY_SESSION, TASK_COMEDY_COMPRESS, TASK_MEMOCHAT_WRITE,
                                 TASK_MEMOCHAT_RETRIEVE)
BASELINE_TASKS = (*BASELINE_TASKS, *TABLE6_TASKS)

RSUM_INSTRUCTION = (
    "Below are the assistant's memory of the user so far and the conversation session that just ended. Write the "
    "updated memory: keep what is still true from the previous memory, add what the new session revealed about "
    "the user (who they are, their circumstances, preferences, plans and the events they told of), and replace "
    "what the new session contradicts. Be concise and keep names, dates and numbers exactly. Output only the "
    "updated memory.")
COMEDY_SESSION_INSTRUCTION = (
    "Write the memory of the conversation session below: the events it told of, what the user revealed about "
    "themselves (character, circumstances, preferences) and how the user and the assistant got on. A few short "
    "sentences; keep names, dates and numbers exactly. Output only the memory.")
COMEDY_COMPRESS_INSTRUCTION = (
    "Below are the memories of every earlier session with the user, oldest first. Compress them into one memory "
    "of three parts: the user's profile (lasting traits, circumstances and preferences), the dynamics of the "
    "relationship between the user and the assistant, and the past events worth recalling, each with its session. "
    "Merge what repeats; where sessions disagree, keep the newest. Answer with a JSON object: "
    '{"user_profile": "...", "relationship": "...", "events": ["...", ...]}.')
MEMOCHAT_WRITE_INSTRUCTION = (
    "Split the conversation session below into the topics it covered and write one memo per topic: a short topic "
    "name, a one- or two-sentence summary of what was said about it (above all what the user revealed) and the "
    "ids of the turns it spans. Greetings and small talk get no memo. Answer with a JSON object: "
    '{"memos": [{"topic": "...", "summary": "...", "turns": [id, ...]}, ...]}, with an empty list when nothing '
    "deserves a memo.")
MEMOCHAT_RETRIEVE_INSTRUCTION = (
    "A user's utterance and the memos of earlier conversations with them (each with its id attribute) follow. "
    "Pick the memos that the reply to the utterance needs, most relevant first, at most {max_memos}; pick none "
    'when no memo is relevant. Answer with a JSON object: {{"memos": [id, ...]}}.')

COMEDY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"user_profile": {"type": "string"}, "relationship": {"type": "string"},
                   "events": {"type": "array", "items": {"type": "string"}}},
    "required": ["user_profile", "relationship", "events"],
}
MEMOCHAT_WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memos": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"topic": {"type": "string"}, "summary": {"type": "string"},
                               "turns": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
                "required": ["topic", "summary", "turns"],
            },
        },
    },
    "required": ["memos"],
}
MEMOCHAT_RETRIEVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memos": {"type": "array", "items": {"type": "string"}}},
    "required": ["memos"],
}


def rsum_update_request(previous: str | None, turns: Turns, *, session: int, max_output_tokens: int = 256,
                        metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the running summary after `session`, from the previous one (None: the first session) and its turns
    (Rsum's memory iteration)."""
    shown = quote("memory", previous) if previous else "(no memory yet)"
    prompt = (f"{RSUM_INSTRUCTION}\n\nPrevious memory:\n{shown}\n\nSession {session + 1}:\n{_turn_lines(turns)}"
              "\n\nUpdated memory:")
    return LLMRequest(prompt=prompt, system=MEMORY_SYSTEM, max_output_tokens=max_output_tokens, temperature=0.0,
                      task=TASK_RSUM_UPDATE, metadata={"session": int(session), "previous": previous or "",
                                                       "turns": _turns_md(turns), **dict(metadata or {})})


def comedy_session_request(turns: Turns, *, session: int, max_output_tokens: int = 192,
                           metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the session-level memory of one finished session (COMEDY's first task)."""
    prompt = f"{COMEDY_SESSION_INSTRUCTION}\n\nSession {session + 1}:\n{_turn_lines(turns)}\n\nMemory:"
    return LLMRequest(prompt=prompt, system=MEMORY_SYSTEM, max_output_tokens=max_output_tokens, temperature=0.0,
                      task=TASK_COMEDY_SESSION,
                      metadata={"session": int(session), "turns": _turns_md(turns), **dict(metadata or {})})


def comedy_compress_request(memories: Sequence[tuple[int, str]], *, max_output_tokens: int = 384,
                            metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the one compressive memory of the session memories ((session, text), oldest first; COMEDY's
    second task)."""
    listed = "\n".join(quote("memory", text, session=str(s + 1)) for s, text in memories) or "(none)"
    prompt = f"{COMEDY_COMPRESS_INSTRUCTION}\n\nSession memories:\n{listed}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=COMEDY_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_COMEDY_COMPRESS,
                      metadata={"memories": [{"session": int(s), "text": text} for s, text in memories],
                                **dict(metadata or {})})


def memochat_write_request(turns: Turns, *, session: int, max_output_tokens: int = 384,
                           metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask for the topic memos of one finished session (MemoChat's memo writing)."""
    prompt = f"{MEMOCHAT_WRITE_INSTRUCTION}\n\nSession {session + 1}:\n{_turn_lines(turns)}"
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=MEMOCHAT_WRITE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_MEMOCHAT_WRITE,
                      metadata={"session": int(session), "turns": _turns_md(turns), **dict(metadata or {})})


def memochat_retrieve_request(utterance: str, memos: Sequence[tuple[str, str, str]], *, max_memos: int,
                              max_output_tokens: int = 64, metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """Ask which of the memos ((id, topic, summary)) the reply to `utterance` needs (MemoChat's retrieval)."""
    listed = "\n".join(quote("memory", f"{topic}: {summary}", id=i) for i, topic, summary in memos) or "(none)"
    prompt = (f"{MEMOCHAT_RETRIEVE_INSTRUCTION.format(max_memos=max_memos)}\n\nMemos:\n{listed}\n\n"
              f"Utterance:\n{quote('dialogue', utterance)}")
    return LLMRequest(prompt=prompt, system=JSON_SYSTEM, json_schema=MEMOCHAT_RETRIEVE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_MEMOCHAT_RETRIEVE,
                      metadata={"utterance": utterance, "max_memos": int(max_memos),
                                "memos": [{"id": i, "topic": t, "summary": s} for i, t, s in memos],
                                **dict(metadata or {})})


def _joined(value: Any) -> str | None:
    """A text field of an answer: a string (whitespace collapsed) or a list of strings joined by '; '; None: neither."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(" ".join(v.split()) for v in value if v.strip())
    return None


def parse_compressive(response: LLMResponse) -> tuple[dict[str, Any] | None, str | None]:
    """({"user_profile": str, "relationship": str, "events": [str]}, problem), leniently (a list for a text part, a
    string for the events); None when the answer is unusable: not an object, or every part empty or unreadable. A
    problem with a result means some part was left out."""
    value, error = _value(response)
    if error is not None:
        return None, error
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    out: dict[str, Any] = {}
    problems = []
    for key in ("user_profile", "relationship"):
        text = _joined(value.get(key, ""))
        if text is None:
            problems.append(f"{key} is not a text: {value.get(key)!r}"[:120])
        out[key] = text or ""
    events = value.get("events", [])
    events = [events] if isinstance(events, str) else events
    if not isinstance(events, list):
        problems.append(f"events is not a list: {events!r}"[:120])
        events = []
    out["events"] = []
    for event in events:
        if isinstance(event, str) and event.strip():
            out["events"].append(" ".join(event.split()))
        else:
            problems.append(f"event without a text: {event!r}"[:120])
    if not (out["user_profile"] or out["relationship"] or out["events"]):
        return None, "; ".join(problems) or "every part of the compressive memory is empty"
    return out, "; ".join(problems) or None


def _turn_ids(value: Any) -> tuple[list[int], list[str]]:
    """Turn ids from an int, a digit string, an "a-b" range or a list of them; (ids, unreadable items)."""
    items = value if isinstance(value, list) else [value]
    ids, bad = [], []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            ids.append(item)
        elif isinstance(item, str) and item.strip().isdigit():
            ids.append(int(item))
        elif isinstance(item, str) and len(parts := item.replace(" ", "").split("-")) == 2 \
                and all(p.isdigit() for p in parts) and int(parts[0]) <= int(parts[1]):
            ids.extend(range(int(parts[0]), int(parts[1]) + 1))
        else:
            bad.append(repr(item)[:40])
    return ids, bad


def parse_memos(response: LLMResponse, valid_turns: Sequence[int]
                ) -> tuple[list[tuple[str, str, tuple[int, ...]]] | None, str | None]:
    """(memos as (topic, summary, turn ids), problem): leniently, {"memos": [...]} or a bare list; turn ids as
    ints, digit strings or "a-b" ranges. None when the answer is unusable; a problem with memos means an item
    was left out (no topic or summary) or some turn ids were (not in `valid_turns`, unreadable)."""
    value, error = _value(response)
    if error is not None:
        return None, error
    items = value.get("memos") if isinstance(value, dict) else value
    if not isinstance(items, list):
        return None, f"expected a list of memos, got {type(items).__name__}"
    valid = set(valid_turns)
    memos, problems = [], []
    for item in items:
        if not isinstance(item, dict):
            problems.append(f"memo is not an object: {item!r}"[:120])
            continue
        topic, summary = _joined(item.get("topic")), _joined(item.get("summary"))
        if not topic or not summary:
            problems.append(f"memo without a topic or summary: {item!r}"[:120])
            continue
        ids, bad = _turn_ids(item.get("turns", []))
        unknown = [t for t in ids if t not in valid]
        if bad or unknown:
            problems.append(f"memo {topic[:40]!r}: turn ids {[*bad, *map(str, unknown)]} left out")
        memos.append((topic, summary, tuple(dict.fromkeys(t for t in ids if t in valid))))
    return memos, "; ".join(problems) or None


def parse_selection(response: LLMResponse, ids: Sequence[str]) -> tuple[list[str] | None, str | None]:
    """(the memo ids picked, in order, without repeats; problem): leniently, {"memos": [...]} or a bare list of
    ids (strings or ints). None when the answer is unusable; a problem with ids means some picked ids were not
    among those shown and were left out."""
    value, error = _value(response)
    if error is not None:
        return None, error
    items = value.get("memos") if isinstance(value, dict) else value
    if not isinstance(items, list):
        return None, f"expected a list of memo ids, got {type(items).__name__}"
    shown = set(ids)
    picked = [str(i).strip() for i in items if not isinstance(i, bool) and isinstance(i, (str, int))]
    unknown = [i for i in items if isinstance(i, bool) or not isinstance(i, (str, int)) or str(i).strip() not in shown]
    picked = list(dict.fromkeys(i for i in picked if i in shown))
    return picked, (f"memo ids {unknown!r} were not among those shown {list(ids)}"[:200] if unknown else None)


__all__ += ["COMEDY_SCHEMA", "MEMOCHAT_RETRIEVE_SCHEMA", "MEMOCHAT_WRITE_SCHEMA", "TABLE6_TASKS",
            "TASK_COMEDY_COMPRESS", "TASK_COMEDY_SESSION", "TASK_MEMOCHAT_RETRIEVE", "TASK_MEMOCHAT_WRITE",
            "TASK_RSUM_UPDATE", "comedy_compress_request", "comedy_session_request", "memochat_retrieve_request",
            "memochat_write_request", "parse_compressive", "parse_memos", "parse_selection", "rsum_update_request"]
