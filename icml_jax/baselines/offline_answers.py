"""The offline back end's answers to the baselines' tasks: deterministic rules over what a model is shown (the
turn texts and memories in the request's metadata), never the data's labels (y_p / y_t).

- baseline_summarize: "The user said: " and the first clause (up to the first , ; . ! or ?) of each USER turn,
  joined by "; "; "Small talk only." when the session has no USER turn. A lossy summary, as a real one is.
- baseline_extract_facts: every sentence of a USER turn that is not a question and whose
  `heuristic_information_value` (the offline proxy judge's self-disclosure + fact-word score) is >= 0.5, with
  its turn id, at most `max_facts` (the prompt says questions are not facts).
- baseline_mem0_decide: NOOP when a shown memory already holds every content word of the fact; else, when a
  memory is on the same topic (home, work, diet, pets, family, study, hobbies: small word lists), DELETE it if
  the fact negates it and adds no new word ("I don't have a dog anymore"), else UPDATE it with the fact's text
  ("I moved to Berlin" replaces "I live in Paris"); else ADD the fact.
- baseline_rsum_update: the previous summary's items (the "; "-separated clauses of a "The user said: ..."
  summary; any other text is one item) followed by the session's first clauses of USER turns (as
  baseline_summarize) that are not already there, written as baseline_summarize writes.
- baseline_comedy_session: the baseline_summarize rule.
- baseline_comedy_compress: user_profile = every item of the session memories (as above) whose
  `heuristic_information_value` is >= 0.5, joined by "; "; relationship = how many sessions there were and the
  topics (the word lists above) their items touch; events = "Session k: " and each session memory's items.
- baseline_memochat_write: each USER turn goes to the topic (the word lists above) most of its content words
  are in (ties: the lists' order), else to "personal" when its information value is >= 0.5, else to no memo;
  one memo per topic in order of first appearance, its summary the baseline_summarize rule over its turns.
- baseline_memochat_retrieve: the memos sharing a content word with the utterance (topic and summary), most
  shared words first (ties: the order shown), at most `max_memos`.
- baseline_ld_persona: the user's traits are extract_facts' sentences of the USER turns; the agent's are the
  other turns' sentences, not questions, that speak of the speaker (I, my, me) and score >= 0.5 the same way;
  at most `max_traits` each.
- baseline_amem_note: keep when the turn's `heuristic_information_value` is >= 0.5; keywords = the turn's first
  `max_keywords` distinct content words; tags = the topics (the word lists above) they meet; context = "About "
  and the first three keywords.
- baseline_amem_evolve: link every shown note whose content or keywords share a content word with the new
  note's keywords; each linked note whose tags lack some of the new note's gains them (its context is kept).
- baseline_memoryos_promote: knowledge = every page sentence that is not a question and scores >= 0.5 as
  above, with its page id, at most `max_facts`; profile = "Topics the user talks about: " and the topic names
  (the word lists above) named in the old profile or met by the new facts, sorted.
- baseline_theanine_link: link every candidate sharing a content word with the new memory; the relation is
  "causal" when the new memory has a cause word (because, so, since, therefore, due), else "temporal".
- baseline_theanine_refine: the timelines' memories that share a content word with the utterance (a timeline
  sharing none gives its newest memory), each once, oldest first, as "In session n, <memory>" sentences, a
  causal step's sentence starting "As a result, "; "Nothing relevant." when there is no step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from icml_jax.baselines.prompts import (
    BASELINE_TASKS,
    TASK_AMEM_EVOLVE,
    TASK_AMEM_NOTE,
    TASK_COMEDY_COMPRESS,
    TASK_COMEDY_SESSION,
    TASK_EXTRACT_FACTS,
    TASK_LD_PERSONA,
    TASK_MEM0_DECIDE,
    TASK_MEMOCHAT_RETRIEVE,
    TASK_MEMOCHAT_WRITE,
    TASK_MEMORYOS_PROMOTE,
    TASK_RSUM_UPDATE,
    TASK_SUMMARIZE,
    TASK_THEANINE_LINK,
    TASK_THEANINE_REFINE,
)
from icml_jax.llm.offline import heuristic_information_value, register_offline_answers

FACT_THRESHOLD = 0.5
_WORD = re.compile(r"[a-z0-9']+")
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
_CLAUSE = re.compile(r"[,;.!?]")
_STOP = frozenset(
    """a an the and or but if then so to of in on at for with about as is are was were be been being do does did
    have has had it its this that these those you your i i'm im i've i'd me my mine we our they them their he she
    his her what how why when where who which yes just really very too also can could would should will there here
    from by up down out over into than all any some am now since while user""".split())
_NEGATION = frozenset("not no never don't doesn't didn't isn't aren't wasn't won't anymore longer nor without "
                      "stopped quit".split())
TOPICS: dict[str, frozenset[str]] = {
    "home": frozenset("live lives living lived moved move moving relocated city town country apartment flat house "
                      "neighborhood".split()),
    "work": frozenset("work works working worked job career boss office company teacher engineer nurse doctor "
                      "retired retire hired fired".split()),
    "diet": frozenset("eat eating eats ate diet vegan vegetarian kosher halal allergic allergy gluten".split()),
    "pets": frozenset("dog dogs cat cats pet pets puppy kitten".split()),
    "family": frozenset("wife husband partner son daughter kid kids child children married divorced baby "
                        "pregnant".split()),
    "study": frozenset("study studying school college university degree student".split()),
    "hobby": frozenset("hobby hobbies play plays playing run running marathon guitar piano paint painting "
                       "hiking".split()),
}


def content_words(text: str) -> set[str]:
    """Lower-cased words of `text` without stop words (those a fact is about)."""
    return {w for w in _WORD.findall((text or "").lower()) if w not in _STOP}


def topics(words: set[str]) -> set[str]:
    """The topics whose word lists meet `words`."""
    return {name for name, vocab in TOPICS.items() if words & vocab}


def summarize(turns: list[Mapping[str, Any]]) -> str:
    """The offline session summary (see the module docstring)."""
    clauses = [_CLAUSE.split(str(t["text"]).strip(), maxsplit=1)[0].strip() for t in turns if t.get("user")]
    clauses = [c for c in clauses if c]
    return f"The user said: {'; '.join(clauses)}." if clauses else "Small talk only."


def extract_facts(turns: list[Mapping[str, Any]], max_facts: int) -> list[dict[str, Any]]:
    """The offline facts: (turn id, sentence) of USER sentences, not questions, scoring >= FACT_THRESHOLD."""
    facts = []
    for t in turns:
        if not t.get("user"):
            continue
        for match in _SENTENCE.finditer(str(t["text"])):
            sentence = match.group().strip()
            if sentence and not sentence.endswith("?") and heuristic_information_value(sentence) >= FACT_THRESHOLD:
                facts.append({"turn": int(t["turn"]), "fact": sentence})
    return facts[:max(0, max_facts)]


def decide(fact: str, memories: list[Mapping[str, Any]]) -> dict[str, str]:
    """The offline Mem0 event for `fact` among the shown `memories` (see the module docstring)."""
    new = content_words(fact)
    for m in memories:
        if new and new <= content_words(str(m["text"])):
            return {"event": "NOOP", "id": str(m["id"]), "text": ""}
    new_topics = topics(new)
    same = [(len(new_topics & topics(content_words(str(m["text"])))), len(new & content_words(str(m["text"]))), -i,
             m) for i, m in enumerate(memories)]
    same = [s for s in same if s[0] > 0]
    if same:
        *_, best = max(same, key=lambda s: s[:3])
        old = content_words(str(best["text"]))
        if new & _NEGATION and not new - old - _NEGATION:  # negated, nothing new in its place
            return {"event": "DELETE", "id": str(best["id"]), "text": ""}
        return {"event": "UPDATE", "id": str(best["id"]), "text": fact}
    return {"event": "ADD", "id": "", "text": fact}


def answer(task: str, md: Mapping[str, Any]) -> str:
    """The offline back end's answer text to a baseline request."""
    if task == TASK_SUMMARIZE:
        return summarize(list(md["turns"]))
    if task == TASK_EXTRACT_FACTS:
        return json.dumps({"facts": extract_facts(list(md["turns"]), int(md.get("max_facts", 5)))})
    if task == TASK_MEM0_DECIDE:
        return json.dumps(decide(str(md["fact"]), list(md.get("memories") or [])))
    if task == TASK_RSUM_UPDATE:
        return rsum_update(str(md.get("previous") or ""), list(md["turns"]))
    if task == TASK_COMEDY_SESSION:
        return summarize(list(md["turns"]))
    if task == TASK_COMEDY_COMPRESS:
        return json.dumps(comedy_compress(list(md["memories"])))
    if task == TASK_MEMOCHAT_WRITE:
        return json.dumps({"memos": memochat_write(list(md["turns"]))})
    if task == TASK_MEMOCHAT_RETRIEVE:
        return json.dumps({"memos": memochat_retrieve(str(md["utterance"]), list(md.get("memos") or []),
                                                      int(md["max_memos"]))})
    if task == TASK_LD_PERSONA:
        return json.dumps(ld_personas(list(md["turns"]), int(md.get("max_traits", 5))))
    if task == TASK_AMEM_NOTE:
        return json.dumps(amem_note(str(md["text"]), int(md.get("max_keywords", 5))))
    if task == TASK_AMEM_EVOLVE:
        return json.dumps(amem_evolve(md["note"], list(md.get("neighbours") or [])))
    if task == TASK_MEMORYOS_PROMOTE:
        return json.dumps(memoryos_promote(list(md["pages"]), str(md.get("profile") or ""),
                                           int(md.get("max_facts", 5))))
    if task == TASK_THEANINE_LINK:
        return json.dumps(theanine_links(str(md["memory"]), list(md.get("candidates") or [])))
    if task == TASK_THEANINE_REFINE:
        return theanine_refine(str(md["utterance"]), list(md["timelines"]))
    raise ValueError(f"offline back end: {task!r} is not a baseline task")


# -- Table 6's memory methods (Rsum, COMEDY, MemoChat) ---------------------------------------------------------

_SAID = "The user said: "
_SMALL_TALK = "Small talk only."


def said_items(text: str) -> list[str]:
    """The items of a summary as `summarize` writes it (its "; "-separated clauses); other text is one item (its
    final full stops dropped)."""
    text = " ".join((text or "").split())
    if not text or text == _SMALL_TALK:
        return []
    if text.startswith(_SAID):
        return [c.strip() for c in text[len(_SAID):].rstrip(".").split("; ") if c.strip()]
    return [text.rstrip(". ")] if text.rstrip(". ") else []


def _said(items: list[str]) -> str:
    return f"{_SAID}{'; '.join(items)}." if items else _SMALL_TALK


def rsum_update(previous: str, turns: list[Mapping[str, Any]]) -> str:
    """The offline running summary (see the module docstring)."""
    items = said_items(previous)
    seen = {i.lower() for i in items}
    for item in said_items(summarize(turns)):
        if item.lower() not in seen:
            seen.add(item.lower())
            items.append(item)
    return _said(items)


def comedy_compress(memories: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The offline compressive memory (see the module docstring)."""
    per_session = [(int(m["session"]), said_items(str(m["text"]))) for m in memories]
    every = [item for _, items in per_session for item in items]
    profile = list(dict.fromkeys(i for i in every if heuristic_information_value(i) >= FACT_THRESHOLD))
    touched = sorted(topics({w for item in every for w in content_words(item)}))
    n = len(per_session)
    relationship = f"They have talked in {n} earlier session{'s' if n != 1 else ''}" + (
        f", about {', '.join(touched)}." if touched else ".")
    events = [f"Session {s + 1}: {'; '.join(items)}." for s, items in per_session if items]
    return {"user_profile": "; ".join(profile), "relationship": relationship, "events": events}


def memochat_write(turns: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The offline topic memos (see the module docstring)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for t in turns:
        if not t.get("user"):
            continue
        words = content_words(str(t["text"]))
        hits = [(len(words & vocab), -i, name) for i, (name, vocab) in enumerate(TOPICS.items()) if words & vocab]
        topic = max(hits)[2] if hits else None
        if topic is None and heuristic_information_value(str(t["text"])) >= FACT_THRESHOLD:
            topic = "personal"
        if topic is not None:
            groups.setdefault(topic, []).append(t)
    return [{"topic": topic, "summary": summarize(group), "turns": [int(t["turn"]) for t in group]}
            for topic, group in groups.items()]


def memochat_retrieve(utterance: str, memos: list[Mapping[str, Any]], max_memos: int) -> list[str]:
    """The offline memo selection (see the module docstring)."""
    query = content_words(utterance)
    shared = [(len(query & content_words(f"{m['topic']} {m['summary']}")), -i, str(m["id"]))
              for i, m in enumerate(memos)]
    return [memo_id for n, _, memo_id in sorted(shared, reverse=True) if n > 0][:max(0, max_memos)]


register_offline_answers(BASELINE_TASKS, answer)

__all__ = ["FACT_THRESHOLD", "TOPICS", "answer", "content_words", "decide", "extract_facts", "summarize", "topics"]
__all__ += ["comedy_compress", "memochat_retrieve", "memochat_write", "rsum_update", "said_items"]


# -- LD-Agent --------------------------------------------------------------------------------------------------

_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|my|me|mine)\b", re.IGNORECASE)


def ld_personas(turns: list[Mapping[str, Any]], max_traits: int) -> dict[str, list[dict[str, Any]]]:
    """The offline LD-Agent traits of both speakers (see the module docstring)."""
    agent = []
    for t in turns:
        if t.get("user"):
            continue
        for match in _SENTENCE.finditer(str(t["text"])):
            sentence = match.group().strip()
            if (sentence and not sentence.endswith("?") and _FIRST_PERSON.search(sentence)
                    and heuristic_information_value(sentence) >= FACT_THRESHOLD):
                agent.append({"turn": int(t["turn"]), "trait": sentence})
    user = [{"turn": f["turn"], "trait": f["fact"]} for f in extract_facts(turns, max_traits)]
    return {"user": user, "agent": agent[:max(0, max_traits)]}


__all__ += ["ld_personas"]


# -- A-Mem -----------------------------------------------------------------------------------------------------


def ordered_content_words(text: str) -> list[str]:
    """The content words of `text` (see `content_words`) in order of first appearance."""
    return list(dict.fromkeys(w for w in _WORD.findall((text or "").lower()) if w not in _STOP))


def amem_note(text: str, max_keywords: int) -> dict[str, Any]:
    """The offline A-Mem note of a user turn (see the module docstring)."""
    keywords = ordered_content_words(text)[:max(0, max_keywords)]
    return {"keep": heuristic_information_value(text) >= FACT_THRESHOLD, "keywords": keywords,
            "tags": sorted(topics(set(keywords))), "context": f"About {', '.join(keywords[:3])}." if keywords else ""}


def amem_evolve(note: Mapping[str, Any], neighbours: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The offline A-Mem links and neighbour updates of a new note (see the module docstring)."""
    words = {w for k in note.get("keywords") or [] for w in content_words(str(k))}
    links, updates = [], []
    for n in neighbours:
        theirs = content_words(str(n["content"])) | {w for k in n.get("keywords") or [] for w in content_words(str(k))}
        if not words & theirs:
            continue
        links.append(str(n["id"]))
        old = list(n.get("tags") or [])
        merged = old + [t for t in note.get("tags") or [] if t not in old]
        if merged != old:
            updates.append({"id": str(n["id"]), "context": "", "tags": merged})
    return {"links": links, "updates": updates}


__all__ += ["amem_evolve", "amem_note", "ordered_content_words"]


# -- MemoryOS --------------------------------------------------------------------------------------------------


def memoryos_promote(pages: list[Mapping[str, Any]], profile: str, max_facts: int) -> dict[str, Any]:
    """The offline MemoryOS profile and knowledge of a hot segment (see the module docstring)."""
    facts = []
    for page in pages:
        for match in _SENTENCE.finditer(str(page["text"])):
            sentence = match.group().strip()
            if sentence and not sentence.endswith("?") and heuristic_information_value(sentence) >= FACT_THRESHOLD:
                facts.append({"page": int(page["id"]), "fact": sentence})
    facts = facts[:max(0, max_facts)]
    named = set(_WORD.findall(profile.lower())) & set(TOPICS)
    met = named | {t for f in facts for t in topics(content_words(f["fact"]))}
    return {"profile": f"Topics the user talks about: {', '.join(sorted(met))}." if met else profile,
            "knowledge": facts}


__all__ += ["memoryos_promote"]


# -- THEANINE --------------------------------------------------------------------------------------------------

CAUSE_WORDS = frozenset("because so since therefore due".split())


def theanine_links(memory: str, candidates: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The offline THEANINE links of a new memory (see the module docstring)."""
    words = content_words(memory)
    relation = "causal" if set(_WORD.findall(memory.lower())) & CAUSE_WORDS else "temporal"
    return {"links": [{"id": str(c["id"]), "relation": relation} for c in candidates
                      if words & content_words(str(c["text"]))]}


def theanine_refine(utterance: str, timelines: list[list[Mapping[str, Any]]]) -> str:
    """The offline THEANINE context of the retrieved timelines (see the module docstring)."""
    words = content_words(utterance)
    kept: dict[tuple[int, str], str | None] = {}
    for steps in timelines:
        chosen = [s for s in steps if words & content_words(str(s["text"]))] or list(steps[-1:])
        for s in chosen:
            kept.setdefault((int(s["session"]), str(s["text"])), s.get("relation"))
    sentences = []
    for (session, text), relation in sorted(kept.items(), key=lambda kv: kv[0][0]):
        body = text.rstrip(".!?") + "."
        sentences.append(f"{'As a result, in' if relation == 'causal' else 'In'} session {session + 1}, {body}")
    return " ".join(sentences) if sentences else "Nothing relevant."


__all__ += ["CAUSE_WORDS", "theanine_links", "theanine_refine"]
