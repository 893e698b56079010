"""Every baseline through `icml_jax.evaluate.evaluate_agent` on the tiny demo config (one held-out persona-world
episode, offline generator and judge): the protocol's rows, the memory each system shows, its provenance."""

from __future__ import annotations

import json

import pytest

from icml_jax import evaluate as ev
from icml_jax.baselines import BASELINES, baseline_factory
from icml_jax.data.stream import held_out_episodes
from icml_jax.evaluation.protocol import gold_history
from icml_jax.evaluation.report import RESULTS_JSON, TARGETS_JSONL
from icml_jax.llm.prompts import reply_request
from tests.baselines.test_interface import load_config


@pytest.fixture(scope="module")
def demo():
    config = load_config("demo")
    config.data.eval_episodes = 1
    (episode,) = held_out_episodes(config)
    return config, episode


@pytest.mark.parametrize("name", list(BASELINES))
def test_every_baseline_plays_the_evaluation(demo, tmp_path, name):
    config, episode = demo
    content = ev.evaluate_agent(config, tmp_path, baseline_factory(name), system=name)
    out = tmp_path / ev.EVAL_DIR
    rows = [json.loads(line) for line in (out / TARGETS_JSONL).read_text().splitlines()]
    final = len(episode.sessions) - 1
    assert len(rows) == content["targets"] == len(episode.sessions[final].turns) - 1
    assert json.loads((out / RESULTS_JSON).read_text())["system"] == name == content["system"]
    setting = content["setting"]
    assert setting["baseline"] == name and setting["malformed_answers"] == {}  # the offline answers are well formed
    assert all(r["episode_id"] == episode.episode_id and r["session"] == final and r["reply"] for r in rows)
    assert all(ref[0] < final for r in rows for ref in r["memory_refs"])  # memory only from earlier sessions
    acted = sum(t.speaker == "user" for s in episode.sessions[:-1] for t in s.turns)
    calls = setting["llm_usage"]["generator"]["calls"]  # every LLM call went through the evaluation's generator
    if name == "no_memory":
        assert all(r["memory"] is None and r["memory_refs"] == [] and r["memory_tokens"] == 0 for r in rows)
        assert content["efficiency"]["storage_tokens_per_session"] == [0] * final and calls == len(rows)
    elif name == "long_context":  # the newest earlier turns that fit the tiny decoder's 512 positions
        assert setting["context_tokens"] == 512 and calls == len(rows)
        assert setting["context_source"] == "backbone max_position_embeddings"  # the offline generator is local
        history = [[s, t] for s in range(final) for t in range(len(episode.sessions[s].turns))]
        tokenizer = ev.build_tokenizer(config, tmp_path)
        count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        assert rows[0]["memory_refs"] and rows[0]["memory"].startswith(f"Session {final}")
        for r in rows:  # later targets have a longer recent dialogue in the prompt, so room for fewer turns
            assert r["memory_refs"] == history[len(history) - len(r["memory_refs"]):]
            request = reply_request(gold_history(episode, final, r["turn"]), r["utterance"], r["memory"])
            assert count(request.system) + count(request.prompt) + config.learner.reply_max_tokens <= 512
    elif name in ("dense", "heuristic"):
        assert calls == len(rows) + acted  # one condense call per acted turn
        if name == "dense":
            assert all(len(r["memory_refs"]) == 3 for r in rows) and "random tiny decoder" in setting["encoder"]
        else:
            assert all(len(r["memory_refs"]) <= 1 for r in rows) and any(r["memory_refs"] for r in rows)
    elif name == "memorybank":
        assert calls == len(rows) + 2 * final and setting["stats"]["summaries"] == final  # summary + facts
    elif name == "mem0":
        assert calls >= len(rows) + acted and sum(setting["events"].values()) > 0
    elif name == "rsum":  # one summary update per earlier session; every reply reads the whole summary
        assert calls == len(rows) + final and setting["stats"]["updates"] == final
        assert all(r["memory"] == rows[0]["memory"] and len(r["memory_refs"]) == acted for r in rows)
    elif name == "comedy":  # session memory + compression per earlier session
        assert calls == len(rows) + 2 * final and setting["stats"]["compressions"] == final
        assert all(r["memory"] == rows[0]["memory"] and "Past events:" in r["memory"] for r in rows)
    elif name == "memochat":  # memo writing per earlier session, one retrieval per reply asked for after the first
        assert calls == len(rows) + final + setting["stats"]["retrievals"] and setting["stats"]["memos"] > 0
        assert setting["stats"]["retrievals"] >= len(rows) and any(r["memory_refs"] for r in rows)
    elif name == "ld_agent":  # a summary and a persona request per earlier session
        assert calls == len(rows) + 2 * final and setting["stats"]["events"] == final
        assert all(r["memory_refs"] for r in rows)
    elif name == "a_mem":  # a note call per acted turn, an evolution call per note with candidates
        stats = setting["stats"]
        assert calls == len(rows) + acted + max(stats["notes"] - 1, 0) and stats["notes"] + stats["skipped"] == acted
    elif name == "memoryos":  # every acted turn a page; promotion calls only for hot segments
        stats = setting["stats"]
        assert stats["pages"] == acted and calls == len(rows) + stats["promotions"]
        assert stats["overflowed"] == max(0, acted - setting["short_term_pages"])
    elif name == "theanine":  # facts per earlier session, link calls, a refinement per recall with memory
        stats = setting["stats"]
        assert stats["memories"] > 0 and stats["refinements"] >= len(rows) and all(r["memory_refs"] for r in rows)
        assert calls >= len(rows) + final + stats["refinements"]
    assert content["memory"]["needed_pairs"] > 0  # trigger recall is measured from memory_refs
