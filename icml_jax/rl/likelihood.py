"""The `likelihood` reward: label-free rewards from the generator's teacher-forced likelihood of the episode's own
gold turns, for local-model runs whose LLM judge is too weak to score (SmolLM2-135M's judge is at chance).

- r_trig: the memory the Trigger recalled, as memory gain for the gold next turn (the human's real reply to the
  turn): nll(gold | reply prompt without memory) - nll(gold | with it), nats per token, squashed to
  sigmoid(gain / scale); no memory scores exactly 0.5. The truth reward needs nothing more: the Pending Reward
  Buffer sends a recalled memory's r_trig back to the save that made it, so a save earns the gain it later gives.
- r_proxy: hindsight from the training episode's own later sessions. A turn is worth saving when knowing it makes
  later gold turns likelier: the turn's text as the memory of the `later_turns` gold turns of later sessions most
  similar to it (BM25), the largest gain as an information value clip(gain / scale, 0, 1), like the paper's 0
  (nothing worth remembering) to 1 (lasting personal information); a turn that shares no word with any later turn
  is worth 0. A turn with no later session (the last played one) has no proxy: its decision is left out of the
  update and counted as a proxy failure. Calibrated (`RewardConfig.likelihood_control`): the gain is the turn's
  best gain less a control text's best gain on the same later turns (`control_texts`), since some of any
  text's gain is only its presence in the memory slot (docs/results.md); a turn with later turns but no
  control text is a proxy failure too.

Both read only gold dialogue turns (never labels), and only of the episode the learner plays: the evaluation's
test-time learner hands it the episode without its final session, whose turns are the scored targets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from icml_jax.data.schema import Episode
from icml_jax.llm.judges import GoldTarget, JudgeResult, JudgeStats, ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.prompts import reply_request
from icml_jax.llm.types import LikelihoodBackend, LLMRequest, LoglikRequest, LoglikResponse
from icml_jax.memory.lexical import most_similar
from icml_jax.rl.config import LIKELIHOOD_MATCHES, RewardConfig

NO_NEXT_TURN = "no gold next turn (the session's last turn)"
NO_LATER_TURN = "no later session in the episode"
NO_CONTROL = "no control text (no turn of another episode in the tick)"


def likelihood_score(gain: float, scale: float) -> float:
    """A memory gain (nats per token) as a reward in (0, 1): sigmoid(gain / scale); 0 gain is 0.5."""
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, gain / scale))))


def information_value(gain: float, scale: float) -> float:
    """A turn's best gain for later gold turns as an information value in [0, 1]: clip(gain / scale, 0, 1)."""
    return min(1.0, max(0.0, gain / scale))


def next_gold_turn(episode: Episode, session: int, turn: int) -> str | None:
    """The gold turn after `turn` in its session (what the agent's reply to it stands in for); None at the end."""
    turns = episode.sessions[session].turns
    return turns[turn + 1].text if turn + 1 < len(turns) else None


def later_targets(episode: Episode, session: int, text: str, k: int, match: str = "pair") -> list[GoldTarget] | None:
    """The `k` gold turns of sessions after `session` whose context is most similar to `text` (BM25, best first;
    none that share no word), with their session's dialogue before; None when `session` is the episode's last
    (nothing later to predict). `match`: "pair" compares with each gold turn and the utterance before it;
    "utterance" with the utterance alone, as a Trigger sees it, so the gold turn is not chosen for sharing the
    memory's words."""
    if match not in LIKELIHOOD_MATCHES:
        raise ValueError(f"later_targets: match must be one of {LIKELIHOOD_MATCHES}, got {match!r}")
    if session + 1 >= len(episode.sessions):
        return None
    pool: list[GoldTarget] = []
    for s in episode.sessions[session + 1:]:
        turns = [(t.speaker, t.text) for t in s.turns]
        pool += [GoldTarget(tuple(turns[:j - 1]), turns[j - 1][1], turns[j][1]) for j in range(1, len(turns))]
    keys = [t.utterance if match == "utterance" else f"{t.utterance} {t.gold}" for t in pool]
    return [pool[i] for i in most_similar(text, keys, k)]


def control_texts(texts: Sequence[str], groups: Sequence[Any]) -> list[str | None]:
    """For each text, the text of another group (episode) whose word count is closest to it, the first such on a
    tie; None when every text is of its own group. Deterministic: the calibrated proxy's control."""
    lengths = [len(t.split()) for t in texts]
    out: list[str | None] = []
    for i, group in enumerate(groups):
        others = [j for j, g in enumerate(groups) if g != group]
        out.append(texts[min(others, key=lambda j: (abs(lengths[j] - lengths[i]), j))] if others else None)
    return out


class _LikelihoodJudge:
    """Shared machinery: one deduplicated `loglik` call per batch, per-token NLLs, counters like the LLM judges'.
    The NLLs of the last `CACHE_SIZE` distinct (prompt, gold) pairs are kept: a later gold turn's prompt without
    memory recurs for every turn of its episode that is scored against it."""

    kind = "likelihood"
    CACHE_SIZE = 4096

    def __init__(self, backend: LikelihoodBackend, *, scale: float) -> None:
        if not callable(getattr(backend, "loglik", None)):
            raise ValueError(f"the likelihood reward needs a back end that scores continuations (the local one); "
                             f"{getattr(backend, 'name', type(backend).__name__)} cannot")
        if not scale > 0:
            raise ValueError(f"likelihood reward: scale must be > 0 nats per token, got {scale!r}")
        self.backend, self.scale = backend, float(scale)
        self._stats = JudgeStats()
        self._cache: dict[tuple[str | None, str, str], float] = {}

    @property
    def stats(self) -> JudgeStats:
        return self._stats

    def reset_stats(self) -> JudgeStats:
        stats, self._stats = self._stats, JudgeStats()
        return stats

    def metrics(self) -> dict[str, float]:
        return self._stats.as_metrics(f"judge/{self.kind}")

    def _nll(self, asks: Sequence[tuple[LLMRequest, str]]) -> list[float]:
        """Per-token NLL of each (prompt, gold) pair, each distinct pair scored once (and not again while cached)."""
        requests = {(r.system, r.prompt, gold): LoglikRequest(r, gold) for r, gold in asks}
        known = {k: self._cache[k] for k in requests if k in self._cache}
        todo = [k for k in requests if k not in known]
        answers: list[LoglikResponse] = self.backend.loglik([requests[k] for k in todo]) if todo else []
        known.update((k, a.nll) for k, a in zip(todo, answers, strict=True))
        if len(self._cache) + len(todo) > self.CACHE_SIZE:
            self._cache.clear()
        self._cache.update((k, known[k]) for k in todo)
        return [known[(r.system, r.prompt, gold)] for r, gold in asks]

    def gains(self, targets: Sequence[GoldTarget], memories: Sequence[str]) -> list[float]:
        """Memory gain of each (target, memory) pair: nll without the memory minus nll with it."""
        asks = [(reply_request(t.history, t.utterance, m), t.gold) for t, m in zip(targets, memories, strict=True)]
        asks += [(reply_request(t.history, t.utterance, None), t.gold) for t in targets]
        nll = self._nll(asks)
        n = len(targets)
        return [nll[n + i] - nll[i] for i in range(n)]

    def _count(self, results: Sequence[JudgeResult]) -> list[JudgeResult]:
        failed = sum(1 for r in results if not r.ok)
        self._stats = dataclasses.replace(self._stats, items=self._stats.items + len(results),
                                          failures=self._stats.failures + failed)
        return list(results)


class LikelihoodQualityJudge(_LikelihoodJudge):
    """r_trig: the recalled memory's gain for the gold next turn (`QualityInput.gold_next`), squashed."""

    kind = "quality_likelihood"
    reads_reply = False  # the learner writes no reply for it (OnlineLearner.writes_replies)

    def judge(self, items: Sequence[QualityInput]) -> list[JudgeResult]:
        scored = [i for i, x in enumerate(items) if x.memory and x.gold_next]
        gains = self.gains([GoldTarget(tuple(items[i].history), items[i].utterance, items[i].gold_next)
                             for i in scored], [items[i].memory for i in scored])
        gain_of = dict(zip(scored, gains, strict=True))
        out = []
        for i, x in enumerate(items):
            if not x.gold_next:
                out.append(JudgeResult(score=None, failure=NO_NEXT_TURN))
            else:
                gain = gain_of.get(i, 0.0)
                out.append(JudgeResult(score=likelihood_score(gain, self.scale),
                                       reason=f"memory gain {gain:+.4f} nats per token for the gold next turn"))
        return self._count(out)


class LikelihoodProxyJudge(_LikelihoodJudge):
    """r_proxy: the turn's largest gain, as the memory, over its later gold targets (`ProxyInput.later`; None: the
    episode has no later session), as an information value; with `control`, less the largest gain of the item's
    control text (`ProxyInput.control`) over the same targets."""

    kind = "proxy_likelihood"

    def __init__(self, backend: LikelihoodBackend, *, scale: float, control: bool = False) -> None:
        super().__init__(backend, scale=scale)
        self.control = bool(control)

    def _best(self, asks: Sequence[tuple[int, str, Sequence[GoldTarget]]]) -> dict[int, float]:
        """Item index -> the largest gain of its memory text over its targets (items without targets absent)."""
        pairs = [(i, text, t) for i, text, targets in asks for t in targets]
        gains = self.gains([t for _, _, t in pairs], [text for _, text, _ in pairs])
        best: dict[int, float] = {}
        for (i, _, _), gain in zip(pairs, gains, strict=True):
            best[i] = max(best.get(i, -math.inf), gain)
        return best

    def judge(self, items: Sequence[ProxyInput]) -> list[JudgeResult]:
        controlled = [i for i, x in enumerate(items) if x.later and x.control is not None] if self.control else []
        both = self._best([(i, x.turn_text, x.later or ()) for i, x in enumerate(items)]
                          + [(-1 - i, items[i].control, items[i].later) for i in controlled])
        out = []
        for i, x in enumerate(items):
            if x.later is None:
                out.append(JudgeResult(score=None, failure=NO_LATER_TURN))
            elif i not in both:
                out.append(JudgeResult(score=0.0, reason="no later gold turn shares a word with the turn"))
            elif not self.control:
                out.append(JudgeResult(score=information_value(both[i], self.scale),
                                       reason=f"best memory gain {both[i]:+.4f} nats per token over "
                                              f"{len(x.later)} later gold turn(s)"))
            elif x.control is None:
                out.append(JudgeResult(score=None, failure=NO_CONTROL))
            else:
                gain = both[i] - both[-1 - i]
                out.append(JudgeResult(score=information_value(gain, self.scale),
                                       reason=f"best memory gain {both[i]:+.4f} less the control's "
                                              f"{both[-1 - i]:+.4f} nats per token over {len(x.later)} later gold "
                                              f"turn(s)"))
        return self._count(out)


def reward_judges(reward: RewardConfig, *, judge: Any, generator: Any) -> tuple[Any, Any]:
    """(proxy judge, quality judge) of `reward.source`: "judge" (the LLM judges on `judge`, the paper's) or
    "likelihood" (this module's, on `generator`, the model that writes the replies)."""
    if reward.source == "judge":
        return ProxyJudge(judge), QualityJudge(judge)
    if reward.source == "likelihood":
        return (LikelihoodProxyJudge(generator, scale=reward.likelihood_scale, control=reward.likelihood_control),
                LikelihoodQualityJudge(generator, scale=reward.likelihood_scale))
    raise ValueError(f"rl.reward.source must be 'judge' or 'likelihood', got {reward.source!r}")


__all__ = ["NO_CONTROL", "NO_LATER_TURN", "NO_NEXT_TURN", "GoldTarget", "LikelihoodProxyJudge",
           "LikelihoodQualityJudge", "control_texts", "information_value", "later_targets", "likelihood_score",
           "next_gold_turn", "reward_judges"]
