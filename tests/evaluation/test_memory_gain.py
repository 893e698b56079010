"""Memory gain: log p(gold | prompt with the system's memory) - log p(gold | prompt without), per token, from one
deduplicated likelihood call; a target without memory gains exactly 0; on SmolLM2-135M-Instruct a memory that holds
the gold turn's fact raises its likelihood and an unrelated one does not raise it as much."""

from __future__ import annotations

import pytest

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.evaluation.memory_gain import GAIN, NLL, NLL_NO_MEMORY, can_score, reply_prompt, score_rows
from icml_jax.llm import OfflineBackend
from icml_jax.llm.types import LoglikResponse
from tests.fetched import fetched_dir

EPISODE = Episode("gapchat", "ep1", (
    Session((Turn("A", "I adopted a dog last month."), Turn("B", "What breed?"))),
    Session((Turn("A", "Hi again!"), Turn("B", "Hello! How is your corgi named Biscuit?"),
             Turn("A", "He is great, thanks."), Turn("B", "Does Biscuit still chew your shoes?"))),
))


def row(turn: int, memory: str | None) -> dict:
    """A target row as the protocol writes it: target `turn` of the final session answers turn - 1."""
    final = EPISODE.sessions[1].turns
    return {"episode_id": "ep1", "session": 1, "turn": turn, "utterance": final[turn - 1].text,
            "reference": final[turn].text, "memory": memory}


class WordOverlap:
    """A likelihood back end whose log-probability of a continuation is -1 per word not in the prompt, -0.1 per
    word in it (a memory holding the gold turn's words makes it likelier); records its calls."""

    name = "overlap"

    def __init__(self) -> None:
        self.calls: list[list] = []

    def loglik(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            words = r.continuation.lower().split()
            seen = set(r.request.prompt.lower().split())
            out.append(LoglikResponse(sum(-0.1 if w in seen else -1.0 for w in words), len(words)))
        return out


def test_gain_is_the_nll_drop_and_zero_without_memory_from_one_deduplicated_call():
    rows = [row(1, None), row(3, "The user's corgi Biscuit chews shoes."), row(3, None), row(1, None)]
    backend = WordOverlap()
    score_rows(backend, rows, {"ep1": EPISODE})
    (call,) = backend.calls
    assert len(call) == 3  # two distinct prompts without memory, one with
    assert rows[0][GAIN] == rows[2][GAIN] == 0.0 and rows[0][NLL] == rows[0][NLL_NO_MEMORY]
    with_memory = rows[1]
    # "does biscuit still chew your shoes?": 6 words; the memory adds "biscuit" (the dialogue has no "shoes?")
    assert with_memory[NLL_NO_MEMORY] == pytest.approx(with_memory[NLL] + with_memory[GAIN])
    assert with_memory[GAIN] == pytest.approx(0.9 / 6)
    assert rows[3] == rows[0]


def test_the_scored_prompt_is_the_reply_prompt_of_the_target():
    request = reply_prompt(row(3, "The user has a corgi."), EPISODE, "The user has a corgi.")
    assert "The user has a corgi." in request.prompt and "A: Hi again!" in request.prompt
    assert "He is great, thanks." in request.prompt and "Does Biscuit" not in request.prompt  # the gold turn is not


def test_a_row_of_an_unknown_episode_is_named_and_offline_backends_cannot_score():
    with pytest.raises(KeyError, match="episode 'ep9' \\(session 1, turn 3\\)"):
        score_rows(WordOverlap(), [{**row(3, None), "episode_id": "ep9"}], {"ep1": EPISODE})
    assert can_score(WordOverlap()) and not can_score(OfflineBackend())


def test_smollm2_finds_the_gold_turn_likelier_with_the_memory_that_holds_its_fact():
    from icml_jax.llm.registry import make_backend

    backend = make_backend({"kind": "local", "model_dir": str(fetched_dir("smollm2-135m-instruct")),
                            "dtype": "float32", "max_batch": 4})
    rows = [row(3, "The user has a corgi named Biscuit who chews shoes."), row(3, "The user works as a nurse."),
            row(3, None)]
    score_rows(backend, rows, {"ep1": EPISODE})
    fact, unrelated, none = (r[GAIN] for r in rows)
    assert none == 0.0 and fact > 0.05 and fact > unrelated + 0.05
    assert rows[0][NLL] < rows[2][NLL] and 0.0 < rows[2][NLL] < 10.0


def test_the_summary_the_results_page_and_the_experiment_tables_carry_the_means():
    from icml_jax.evaluation.protocol import play_episode
    from icml_jax.evaluation.report import results_markdown, summarize
    from icml_jax.experiments.tables import cell, metrics_of
    from tests.baselines.helpers import count_words, episode
    from tests.evaluation.test_per_session import Spender

    ep = episode(["hi", "I have a dog."], ["I like tea.", "bye"], ["Hello", "How is it?", "ok"])
    result = play_episode(Spender(), ep, user_speaker="user", count_tokens=count_words)
    assert "Memory gain" not in summarize([result])["generation"]  # not scored: no column value, not 0
    for i, r in enumerate(result.targets):
        r[GAIN], r[NLL] = 0.01 * i, 2.0 + i
    summary = summarize([result])
    n = len(result.targets)
    assert summary["generation"]["Memory gain"] == pytest.approx(0.01 * (n - 1) / 2)
    assert summary["generation"]["NLL"] == pytest.approx(2.0 + (n - 1) / 2)
    page = results_markdown(summary, "ours", {"data": "gapchat"})
    assert f"nats per token): +{0.01 * (n - 1) / 2:.4f}; NLL of the gold turn: {2.0 + (n - 1) / 2:.4f}" in page
    flat = metrics_of(summary)
    assert flat["Memory gain"] == summary["generation"]["Memory gain"]
    assert cell({"mean": 0.01234, "sd": 0.0005, "n": 3}, "Memory gain", 3) == "0.0123 ± 0.0005"


def test_the_evaluation_reply_temperature_replaces_every_systems_own():
    import ml_collections

    from icml_jax.baselines.common import ReplySettings
    from icml_jax.evaluation.protocol import reply_temperature

    config = ml_collections.ConfigDict({"learner": {"reply_temperature": 0.7, "reply_max_tokens": 32},
                                        "eval": {"reply_temperature": None}})
    assert reply_temperature(config) is None and ReplySettings.from_config(config).temperature == 0.7
    config.eval.reply_temperature = 0.0
    assert reply_temperature(config) == 0.0 and ReplySettings.from_config(config).temperature == 0.0
    assert ReplySettings.from_config(config).max_tokens == 32
    config.eval.reply_temperature = 3.0
    with pytest.raises(ValueError, match="eval.reply_temperature must be a number in \\[0, 2\\]"):
        reply_temperature(config)
