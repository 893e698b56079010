"""Small handmade episodes, a recording back end over the offline one, a keyword encoder and the protocol runner
the baseline tests share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.evaluation.protocol import EpisodeResult, MemoryChoice, play_episode
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.types import LLMRequest, LLMResponse, TokenUsage

USER, ASSISTANT = "user", "assistant"


def episode(*sessions: Sequence[str], episode_id: str = "ep-1", reply: str = "I see.") -> Episode:
    """An episode whose sessions alternate the given user turns with a fixed assistant reply."""
    out = []
    for i, said in enumerate(sessions):
        turns = tuple(t for text in said for t in (Turn(USER, text), Turn(ASSISTANT, reply)))
        out.append(Session(turns, gap_seconds=None if i == 0 else 86400.0, gap_text=None if i == 0 else "1 day"))
    return Episode("test", episode_id, tuple(out))


def count_words(text: str) -> int:
    """Whitespace token count (the unit tests' tokenizer)."""
    return len(text.split())


def play(agent, ep: Episode, *, user_speaker: str | None = USER) -> EpisodeResult:
    """The evaluation protocol on one episode."""
    return play_episode(agent, ep, user_speaker=user_speaker, count_tokens=count_words)


class Recording:
    """The offline back end, recording every request; `answers[task](request)` overrides a task's answer text."""

    name = "recording"
    usage = TokenUsage()

    def __init__(self, answers: Mapping[str, Callable[[LLMRequest], str]] | None = None) -> None:
        self.inner, self.answers = OfflineBackend(), dict(answers or {})
        self.requests: list[LLMRequest] = []
        self.calls = 0

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        self.calls += 1
        self.requests.extend(requests)
        return [LLMResponse.answering(r, self.answers[r.task](r)) if r.task in self.answers
                else self.inner.generate([r])[0] for r in requests]

    def tasks(self, task: str) -> list[LLMRequest]:
        """The recorded requests of one task."""
        return [r for r in self.requests if r.task == task]

    def close(self) -> None:
        pass


class KeywordEncoder:
    """A controllable encoder: one dimension per keyword, the keyword's count in the text (lower-cased words),
    plus a small constant so no vector is zero. Records the texts of every call."""

    def __init__(self, keywords: Sequence[str]) -> None:
        self.keywords = list(keywords)
        self.calls: list[list[str]] = []

    def vector(self, text: str) -> np.ndarray:
        words = [w.strip(".,!?'").lower() for w in text.split()]
        return np.asarray([words.count(k) for k in self.keywords] + [0.1], np.float32)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.stack([self.vector(t) for t in texts])

    def cosine(self, a: str, b: str) -> float:
        x, y = self.vector(a), self.vector(b)
        return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def play_two_users(agent) -> tuple[Episode, Episode]:
    """Two users' first two sessions observed interleaved (A's session, then B's), from a reset agent; returns
    their episodes (user ids = episode ids), whose third session is one question each: A has a dog Rex in
    Paris, B a cat Tom in Rome."""
    a = episode(["I have a dog named Rex in Paris."], ["My dog Rex loves Paris."], ["Where is my dog Rex?"],
                episode_id="ep-A")
    b = episode(["I have a cat named Tom in Rome."], ["My cat Tom loves Rome."], ["Is my dog in Rome?"],
                episode_id="ep-B")
    agent.reset()
    for s in range(2):
        for ep in (a, b):
            history: list[tuple[str, str]] = []
            for t, turn in enumerate(ep.sessions[s].turns):
                if turn.speaker == USER:
                    agent.observe(ep.episode_id, ep, s, t, history)
                history.append((turn.speaker, turn.text))
    return a, b


class WordRecall:
    """Keeps every turn; recalls for a question the turns sharing a word of 4+ letters with it. Records what it
    was shown."""

    name = "word-recall"

    def __init__(self) -> None:
        self.turns: list[tuple[int, int, str]] = []
        self.seen: list[Episode] = []  # every episode memorize was given

    def reset(self) -> None:
        self.turns = []

    def memorize(self, user, episode, session, turn, history):
        self.seen.append(episode)
        self.turns.append((session, turn, episode.sessions[session].turns[turn].text))
        return True, 1.0

    def recall_questions(self, user, episode, asked):
        out = []
        for q in asked:
            words = {w.strip("?.,!").lower() for w in q.split() if len(w.strip("?.,!")) >= 4}
            hits = [(s, t, x) for s, t, x in self.turns if words & {w.strip("?.!,").lower() for w in x.split()}]
            refs = tuple((user, s, t) for s, t, _ in hits)
            out.append(MemoryChoice("m", "\n".join(x for _, _, x in hits), refs[0], None, refs) if hits
                       else MemoryChoice(None, None, None, None))
        return out

    def memory_texts(self, user):
        return [x for _, _, x in self.turns]
