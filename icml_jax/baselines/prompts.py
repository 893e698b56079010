"""The baselines' own LLM requests: a session summary and fact extraction (MemoryBank), fact extraction and
the memory-update decision (Mem0). Each has its task name, so the offline back end answers it
(`icml_jax.baselines.offline_answers`), and carries its structured inputs in `metadata` (never labels).
Table 6's memory methods add theirs: the running summary update (Rsum), the session memory and its compression
(COMEDY), memo writing and memo retrieval (MemoChat)."""

from __future__ import annotations

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
    facts, problems = [], []
    for item in items:
        text = item.get("fact") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            problems.append(f"item without a fact text: {item!r}"[:120])
            continue
        turn = item.get("turn") if isinstance(item, dict) else None
        if isinstance(turn, str) and turn.strip().isdigit():
            turn = int(turn)
        if not isinstance(turn, int) or isinstance(turn, bool):
            problems.append(f"fact without a turn id: {text[:60]!r}")
            turn = None
        facts.append((turn, " ".join(text.split())))
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
