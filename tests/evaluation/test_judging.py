"""The judge on evaluation targets: it sees history, utterance, reply and memory but never the system's name;
an answer that stays invalid is a recorded failure, never a zero."""

from __future__ import annotations

import json

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.evaluation.judging import judge_targets
from icml_jax.evaluation.protocol import EpisodeResult
from icml_jax.llm.judges import QualityJudge
from icml_jax.llm.types import LLMResponse, TokenUsage

EPISODE = Episode("gapchat", "ep-7", (Session((Turn("A", "I got a puppy."), Turn("B", "Nice!"))),
                                       Session((Turn("A", "Guess who chewed my shoes?"), Turn("B", "The puppy?"),
                                                Turn("A", "Yes, Biscuit!")))))


def row(turn: int, reply: str) -> dict:
    turns = EPISODE.sessions[1].turns
    return {"episode_id": "ep-7", "session": 1, "turn": turn, "utterance": turns[turn - 1].text, "reply": reply,
            "memory": "A has a puppy.", "memory_ref": [0, 0], "needed": [[0, 0]]}


class Recording:
    """Scores 4 on every dimension, except replies containing 'garbled', answered with broken JSON."""

    name = "recording"
    usage = TokenUsage()

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, requests):
        out = []
        for r in requests:
            self.prompts.append(f"{r.system}\n{r.prompt}")
            text = "{not json" if "garbled" in r.prompt else json.dumps(
                {"reason": "fine", **{d: 4 for d in ("engagingness", "humanness", "coherence", "consistency",
                                                     "memorability")}})
            out.append(LLMResponse.answering(r, text))
        return out

    def close(self):
        pass


def test_judge_sees_the_reply_and_memory_but_not_the_system_and_records_failures():
    backend = Recording()
    result = EpisodeResult("ep-7", [row(1, "Was it your puppy?"), row(2, "garbled reply")], [], [], [], [])
    judge_targets(QualityJudge(backend, max_attempts=2), [result], [EPISODE])
    good, bad = result.targets
    assert good["judge"] == {d: 0.75 for d in ("engagingness", "humanness", "coherence", "consistency",
                                               "memorability")} and good["judge_failure"] is None
    assert bad["judge"] is None and bad["judge_failure"]  # counted as a failure, not scored
    assert len(backend.prompts) == 3  # the invalid answer was re-asked once
    assert all("icml" not in p.lower() and "system under" not in p.lower() for p in backend.prompts)
    assert "Was it your puppy?" in backend.prompts[0] and "A has a puppy." in backend.prompts[0]
    assert "I got a puppy." not in backend.prompts[0]  # only the target session's gold history before the turn


def test_pairwise_verdicts_map_back_to_a_through_random_order_and_refuse_misaligned_targets():
    import pytest

    from icml_jax.evaluation.pairwise import compare
    from icml_jax.llm import OfflineBackend
    from icml_jax.llm.judges import PairwiseJudge

    def rows(reply, ref, n=12):
        return [{**row(2, reply), "turn": t, "history_sha256": "h", "reference": "r", "utterance": "u",
                 "memory_ref": ref, "memory": "A has a puppy." if ref else None} for t in range(1, n + 1)]

    recorded = Recording()
    offline = OfflineBackend()

    class Both:  # the offline oracle answers; every prompt is kept to check what the judge saw
        name, usage = "both", TokenUsage()

        def generate(self, requests):
            recorded.generate(requests)
            return offline.generate(requests)

        def close(self):
            pass

    episode = Episode("gapchat", "ep-7", EPISODE.sessions[:1] + (Session(EPISODE.sessions[1].turns * 5),))
    good, bad = rows("Biscuit again?", [0, 0]), rows("Okay.", None)
    result = compare(good, bad, PairwiseJudge(Both()), [episode], seed=3)
    assert result.failures == 0 and {r["order"] for r in result.rows} == {"AB", "BA"}
    assert all(r["outcome_for_a"] == 1 for r in result.rows)  # the needed memory wins whichever side shows it
    assert result.preference.wins == 12 and result.preference.p_value < 0.001
    flipped = compare(bad, good, PairwiseJudge(Both()), [episode], seed=3)
    assert all(r["outcome_for_a"] == -1 for r in flipped.rows)
    assert all("icml" not in p.lower() for p in recorded.prompts)
    with pytest.raises(ValueError, match="different targets"):
        compare(good, bad[:-1], PairwiseJudge(Both()), [episode])
    with pytest.raises(ValueError, match="'reference'"):
        compare(good, [{**r, "reference": "other"} for r in bad], PairwiseJudge(Both()), [episode])


def test_proxy_truth_correlation_pairs_each_used_save_with_the_quality_of_the_replies_that_used_it():
    import numpy as np
    import pytest

    from icml_jax.evaluation.judging import proxy_truth_correlation
    from icml_jax.llm import OfflineBackend
    from icml_jax.llm.judges import ProxyJudge

    turns = [Turn("A", f"fact {i}", y_p=bool(i % 2)) for i in range(5)]
    episode = Episode("pw", "ep-1", (Session(tuple(turns)), Session((Turn("B", "q"),) * 8)))
    saved = [{"session": 0, "turn": i, "history": []} for i in range(5)]  # offline proxy = y_p: 0, 1, 0, 1, 0
    quality = {0: [0.2, 0.4], 1: [0.9], 2: [0.1], 3: [0.7, 0.8]}  # turn 4's memory was never used
    rows = [{"episode_id": "ep-1", "memory_ref": [0, t], "judge": {"a": q, "b": q}}
            for t, qs in quality.items() for q in qs]
    rows.append({"episode_id": "ep-1", "memory_ref": None, "judge": {"a": 1.0, "b": 1.0}})
    result = EpisodeResult("ep-1", rows, [], [], [], [], saved)
    judged = []

    class Counting(ProxyJudge):
        def judge(self, items):
            judged.extend(item.turn_text for item in items)
            return super().judge(items)

    out = proxy_truth_correlation(Counting(OfflineBackend()), [result], [episode])
    x, y = [0.0, 1.0, 0.0, 1.0], [0.3, 0.9, 0.1, 0.75]
    assert out["saves"] == 5 and out["saves_used"] == 4 and out["proxy_failures"] == 0
    assert judged == ["fact 0", "fact 1", "fact 2", "fact 3"]  # the unused save is not judged
    assert out["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    flat = EpisodeResult("ep-1", rows[:1], [], [], [], [], saved)  # one used save: r undefined, not 0
    assert proxy_truth_correlation(ProxyJudge(OfflineBackend()), [flat], [episode])["r"] is None


def test_a_labelled_target_that_needs_no_memory_is_judged_from_its_label():
    """needed [] is a label ("needs none"): the oracle scores a memory there as a distraction (memorability 2/5)
    and no memory as right (3/5); needed None (unlabelled data) falls back to the lexical heuristic."""
    from icml_jax.llm.offline import OfflineBackend

    def target(memory, needed):
        r = row(1, "Was it your puppy?")
        r.update(memory=memory, memory_ref=[0, 0] if memory else None, memory_refs=[[0, 0]] if memory else [],
                 needed=needed)
        return r

    rows = [target("A's puppy chewed shoes.", []), target(None, []), target("A's puppy chewed shoes.", None)]
    result = EpisodeResult("ep-7", rows, [], [], [], [])
    judge_targets(QualityJudge(OfflineBackend()), [result], [EPISODE])
    assert [r["judge"]["memorability"] for r in rows[:2]] == [0.25, 0.5]
    assert rows[2]["judge"]["memorability"] == 1.0  # the heuristic: the memory overlaps the utterance
