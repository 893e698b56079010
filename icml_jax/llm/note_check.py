"""Whether a memory note carries content: small writers (SmolLM2-135M) echo the condense prompt's framing ("The
user's turn: The user's turn: ...") or loop on a phrase until the token cap, and such a note stores nothing the
turn said. `note_problem` names the first defect of a note, judged against the turn it condenses, or None.

Checks, in order: empty; the prompt's framing (a section header or instruction phrase of the condense request that
the turn itself does not contain); a word trigram repeated `MAX_TRIGRAM_REPEATS` or more times (more often than in
the turn); no content word shared with the turn (words of 3+ letters outside `STOPWORDS`, matched on their first
`STEM_CHARS` letters so "dogs" meets "dog").
"""

from __future__ import annotations

import re
from collections import Counter

from icml_jax.llm import prompts

MAX_TRIGRAM_REPEATS = 3
STEM_CHARS = 4
# the condense request's own words: a note holding one of them (and its turn not) echoes the prompt
FRAMING = ("the user's turn", "recent dialogue", "the user's memories", "no earlier dialogue", "note:",
           "<user_turn", "</user_turn", "<dialogue", "<memory", "write one short note", "output only the note",
           "third person", "replaces:")
STOPWORDS = frozenset(
    "the and for are but not you your yours with this that these those have has had was were will would can could "
    "should shall may might must been being their there they them then than what when where which who whom why how "
    "its it's i'm i've i'd i'll you're you've don't didn't doesn't isn't aren't wasn't can't won't user user's "
    "users also just very really about into from out over some any all our ours his her hers him she he we us "
    "mine myself yes yeah okay well like get got too much many more most such only own same so".split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _content_stems(text: str) -> set[str]:
    return {w[:STEM_CHARS] for w in _words(text) if len(w) >= 3 and w not in STOPWORDS}


def _trigrams(words: list[str]) -> Counter[tuple[str, ...]]:
    return Counter(tuple(words[i:i + 3]) for i in range(len(words) - 2))


def note_problem(note: str, turn_text: str) -> str | None:
    """The first defect of `note` as a memory of `turn_text` ('is empty', 'echoes the prompt ("...")', 'repeats
    "..." N times', "shares no word with the turn"), or None when it carries content."""
    if not note.strip():
        return "is empty"
    low, turn_low = note.lower(), turn_text.lower()
    for phrase in FRAMING:
        if phrase in low and phrase not in turn_low:
            return f'echoes the prompt ("{phrase}")'
    turn_counts = _trigrams(_words(turn_text))
    for gram, n in _trigrams(_words(note)).most_common(1):
        if n >= MAX_TRIGRAM_REPEATS and n > turn_counts.get(gram, 0):
            return f'repeats "{" ".join(gram)}" {n} times'
    turn_stems = _content_stems(turn_text)
    if turn_stems and not _content_stems(note) & turn_stems:
        return "shares no word with the turn"
    return None


def rewrite_instruction(problem: str) -> str:
    """What a re-asked condense request appends: why the first note was rejected and what to write instead."""
    return (f"\n\nYour previous note was rejected: it {prompts.neutralise(problem)}. Write the note again in your "
            "own words: one plain sentence stating a fact about the user from the turn, without repeating these "
            "instructions.")


__all__ = ["FRAMING", "MAX_TRIGRAM_REPEATS", "STEM_CHARS", "STOPWORDS", "note_problem", "rewrite_instruction"]
