"""Every experiment at a smoke size (tiny backbone, offline back ends, 1 evaluation episode, 2 training episodes),
all on one workdir so they share runs as users' experiments do; each checks its table's shape and that its
variants differ where they should."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from icml_jax.experiments import runs
from icml_jax.experiments.catalog import ABLATIONS, EXPERIMENTS, Context, ours
from icml_jax.llm.registry import set_options
from icml_jax.experiments.runner import _seeds_argv, run_experiment
from icml_jax.run.runlog import read_metrics

from tests.config_files import load_config

ROOT = Path(__file__).parents[2]
BASELINES = ("no_memory", "long_context", "dense", "heuristic", "memorybank", "mem0")
TABLE6 = ("memochat", "rsum", "comedy")


def smoke_config():
    """configs/demo.py at the smallest size that still has saves, needs and updates."""
    c = load_config("demo")
    c.data.train_episodes = 2
    c.data.eval_episodes = 1
    c.synthesis.num_seeds = 2
    c.synthesis.storylines_per_seed = 1
    c.synthesis.prequels_per_storyline = 2
    c.synthesis.heldout_fraction = 0.5
    c.checkpoint.every_episodes = 2
    c.online.eval_before = False
    c.experiments.baselines = BASELINES
    c.experiments.table6_baselines = TABLE6
    c.experiments.synthetic_scale = (0, 2)
    c.experiments.lambdas = (0.0, 0.5)
    c.experiments.judges = ("offline", "judge")
    c.experiments.size_grid = (64, 32)
    c.experiments.sessions = 4
    return c


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("experiments")


def _run(name, workdir, seeds=(0,), log=lambda line: None):
    files = run_experiment(name, smoke_config(), workdir, list(seeds), log=log)
    content = json.loads(files["json"].read_text(encoding="utf-8"))
    assert files["md"].read_text(encoding="utf-8").startswith("# ")
    return files, content


def _mean(content, row, key):
    return content["rows"][row]["aggregate"][key]["mean"]


def _table_rows(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("| ")][1:]


def test_main_puts_ours_and_every_baseline_in_table_1(workdir):
    files, content = _run("main", workdir)
    assert list(content["rows"]) == ["ours", *BASELINES]
    assert len(_table_rows(files["md"].read_text(encoding="utf-8"))) == 1 + len(BASELINES)
    assert _mean(content, "no_memory", "memory_tokens") == 0.0
    assert _mean(content, "no_memory", "storage_tokens") == 0.0
    assert _mean(content, "long_context", "prompt_tokens") > _mean(content, "no_memory", "prompt_tokens")
    assert content["setting"]["judge"].startswith("offline (an oracle")
    for row in content["rows"].values():  # every system played the same episodes
        assert row["per_seed"]["0"]["BLEU-4"] is not None
    ids = {json.dumps(p["0"]["episode_ids"]) for p in content["provenance"].values()}
    assert len(ids) == 1


def test_a_scored_run_is_read_back_without_retraining(workdir, tmp_path, monkeypatch):
    """A workdir that kept only results.json files (another machine's or session's runs) rebuilds the tables, also
    when written under another experiments block (which no run reads); one written under another config trains
    anew."""
    src = workdir / "seed0" / "ours" / "eval" / "results.json"
    dst = tmp_path / "seed0" / "ours" / "eval" / "results.json"
    dst.parent.mkdir(parents=True)
    content = json.loads(src.read_text())
    del content["setting"]["config"]["policy"]["remat"]  # written before the key existed (configlib.ADDED_KEYS)
    content["setting"]["config"]["experiments"] = {"seeds_of_another_table": [7]}
    dst.write_text(json.dumps(content))

    def refuse(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(runs, "run_job", refuse)
    assert ours(Context(smoke_config(), tmp_path, [0], lambda line: None), 0) == content
    other = smoke_config()
    other.rl.reward.truth_lambda = 0.125
    with pytest.raises(AssertionError, match="trained again"):
        ours(Context(other, tmp_path, [0], lambda line: None), 0)


def test_table6_puts_ours_and_the_memory_methods_in_table_6(workdir):
    files, content = _run("table6", workdir)
    assert list(content["rows"]) == ["ours", *TABLE6] and content["reproduces"] == "Table 6"
    assert len(_table_rows(files["md"].read_text(encoding="utf-8"))) == 1 + len(TABLE6)
    assert {p["0"]["baseline"] for n, p in content["provenance"].items() if n != "ours"} == set(TABLE6)
    for name in TABLE6:  # each memory method showed its memory from the earlier sessions
        assert _mean(content, name, "memory_tokens") > 0.0 and _mean(content, name, "storage_tokens") > 0.0
    _, table1 = _run("main", workdir)  # the same workdir: ours is the run Table 1 reports
    assert content["rows"]["ours"] == table1["rows"]["ours"] and not set(TABLE6) & set(table1["rows"])


def test_efficiency_reads_main_and_table6_evaluations_and_draws_three_figures(workdir):
    _run("main", workdir)  # Table 1's and Table 6's evaluations: run by the tests above, read back here;
    _run("table6", workdir)  # run here when this test runs alone
    seed = workdir / "seed0"
    results = {p.parent.parent.name: p for p in seed.glob("*/eval/results.json")}
    stale = results["baseline_no_memory"]  # written before the evaluation recorded per-session figures
    content = json.loads(stale.read_text(encoding="utf-8"))
    del content["efficiency"]["per_session"]
    stale.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(ValueError, match="baseline_no_memory/eval/results.json: no per-session efficiency"):
        _run("efficiency", workdir)
    stale.unlink()  # a missing evaluation is run
    before = {name: p.stat().st_mtime_ns for name, p in results.items() if name != "baseline_no_memory"}
    lines = []
    files, content = _run("efficiency", workdir, log=lines.append)
    assert stale.is_file() and "per_session" in json.loads(stale.read_text())["efficiency"]
    assert {name: results[name].stat().st_mtime_ns for name in before} == before  # the others were read back
    assert "seed 0: evaluating no_memory" in lines and "seed 0: dense read back from its results.json" in lines
    assert not [line for line in lines if "evaluating" in line and "no_memory" not in line]  # says what it did
    systems = ["ours", *BASELINES, *TABLE6]
    assert list(content["rows"]) == [f"{s}, session {n}" for s in systems for n in range(1, 7)]
    ours = json.loads(results["ours"].read_text())["efficiency"]["per_session"]
    assert [_mean(content, f"ours, session {n}", "inference_tokens") for n in range(1, 7)] == \
        [r["inference_tokens"] for r in ours]
    assert _mean(content, "no_memory, session 1", "storage_tokens") == 0.0
    assert _mean(content, "long_context, session 6", "inference_tokens") > 0  # its replies
    for key in ("png_tokens", "png_latency", "png_time"):
        assert files[key].read_bytes()[:4] == b"\x89PNG"
    assert "paper: MemoryOS" in files["md"].read_text(encoding="utf-8")


def test_ablation_variants_differ_where_they_should(workdir):
    _, content = _run("ablation", workdir)
    assert list(content["rows"]) == ["full", *ABLATIONS]
    assert _mean(content, "w/o Planner", "save_rate") == 1.0  # every user turn stored
    assert _mean(content, "full", "save_rate") < 1.0
    seed = workdir / "seed0"
    no_truth = [json.loads(x) for x in (seed / "no_truth" / "metrics.jsonl").read_text().splitlines()]
    bonus = [r["rewards/truth_bonus"] for r in no_truth if r.get("rewards/truth_bonus") is not None]
    assert bonus and all(abs(b) < 1e-6 or b != b for b in bonus)  # lambda = 0: no truth reward (NaN: no trigger)
    assert json.loads((seed / "no_truth" / "config.json").read_text())["rl"]["reward"]["truth_lambda"] == 0.0
    assert json.loads((seed / "no_synthetic" / "config.json").read_text())["online"]["init_from"] is None
    assert content["provenance"]["w/o evolution"]["0"]["checkpoint"].endswith("base/warmup")
    updates = [json.loads(x) for x in (seed / "no_trigger" / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("update/decisions/trigger", 0) == 0 for r in updates)  # the rule is never trained
    assert any(r.get("update/decisions/planner", 0) > 0 for r in updates)
    config = smoke_config()  # a subset: the named variants beside the full method, read back from their runs
    config.experiments.ablations = ("w/o evolution",)
    again = json.loads(run_experiment("ablation", config, workdir, [0], log=lambda line: None)["json"].read_text())
    assert list(again["rows"]) == ["full", "w/o evolution"]
    assert again["rows"]["w/o evolution"] == content["rows"]["w/o evolution"]
    config.experiments.ablations = ("w/o evolution", "w/o memory")
    with pytest.raises(ValueError, match=r"experiments.ablations: unknown variant\(s\) \['w/o memory'\]"):
        run_experiment("ablation", config, workdir, [0], log=lambda line: None)


def test_synthetic_scale_synthesizes_per_row(workdir):
    _, content = _run("synthetic_scale", workdir)
    assert list(content["rows"]) == ["0", "2"]
    assert _mean(content, "0", "synthesized") == 0 and _mean(content, "2", "synthesized") > 0


def test_judges_train_one_run_per_reward_model_and_score_all_with_the_config_judge(tmp_path, monkeypatch):
    """The wiring, with the runs recorded instead of played: another reward model trains its own online run from
    the warm-up with that back end as llm.judge; every evaluation keeps the config's judge; the config's own
    reward model is `ours`."""
    local = tmp_path / "tiny-judge"
    local.mkdir()
    (local / "config.json").write_text("{}")
    trained, evaluated = {}, {}

    def online_run(config, workdir, *, init_from, overrides=None):
        derived = runs.derive(config, overrides or {})
        reward = derived.rl.reward
        judge = set_options(derived.llm.judge) if reward.source == "judge" else \
            f"likelihood {reward.likelihood_match} {reward.likelihood_control} {reward.save_cost}"
        trained[workdir.name] = (judge, init_from)
        return workdir

    def evaluate(config, workdir, root, *, system, checkpoint=None, factory=None):
        evaluated[system] = set_options(config.llm.judge)
        with_local = system == f"judge_{local.name}"
        return {"generation": {"BLEU-4": 2.0 if with_local else 1.0}, "memory": {}, "efficiency": {},
                "setting": {"episode_ids": ["e"], "selection": "seeded"}, "targets": 1}

    monkeypatch.setattr(runs, "base_run", lambda config, root, **kw: root / "base" / "warmup")
    monkeypatch.setattr(runs, "online_run", online_run)
    monkeypatch.setattr(runs, "evaluate", evaluate)
    config = smoke_config()
    config.experiments.judges = ("offline", "judge", str(local), "likelihood", "likelihood/utterance+control",
                                 "likelihood/utterance+control+cost0.1")
    files = run_experiment("judges", config, tmp_path / "exp", [0], log=lambda line: None)
    content = json.loads(files["json"].read_text(encoding="utf-8"))
    assert list(content["rows"]) == ["offline", "judge", local.name, "likelihood", "likelihood/utterance+control",
                                     "likelihood/utterance+control+cost0.1"]
    assert content["reproduces"] == "Tables 7 and 11"
    block = {"kind": "local", "model_dir": str(local), "dtype": "float32", "max_output_tokens": 128}
    warmup = tmp_path / "exp" / "seed0" / "base" / "warmup"
    assert trained == {"ours": ({"kind": "offline"}, warmup), f"judge_{local.name}": (block, warmup),
                       "reward_likelihood": ("likelihood pair False 0.5", warmup),
                       "reward_likelihood_utterance_control": ("likelihood utterance True 0.5", warmup),
                       "reward_likelihood_utterance_control_cost0.1": ("likelihood utterance True 0.1", warmup)}
    assert evaluated == {"ours": {"kind": "offline"}, f"judge_{local.name}": {"kind": "offline"},
                         "reward_likelihood": {"kind": "offline"},
                         "reward_likelihood_utterance_control": {"kind": "offline"},
                         "reward_likelihood_utterance_control_cost0.1": {"kind": "offline"}}
    assert content["provenance"][local.name]["0"]["reward_model"] == {"source": "judge", **block}
    assert content["provenance"]["likelihood"]["0"]["reward_model"] == {
        "source": "likelihood", "likelihood_scale": 0.1, "likelihood_later_turns": 2, "likelihood_match": "pair",
        "likelihood_control": False, "save_cost": 0.5}
    assert content["provenance"]["likelihood/utterance+control"]["0"]["reward_model"]["likelihood_control"] is True
    assert _mean(content, "offline", "BLEU-4") == _mean(content, "judge", "BLEU-4") == 1.0
    assert _mean(content, local.name, "BLEU-4") == 2.0
    config.experiments.judges = ("offline", str(local), str(tmp_path / "exp" / ".." / local.name))
    with pytest.raises(ValueError, match="same name"):
        run_experiment("judges", config, tmp_path / "exp", [0], log=lambda line: None)
    for bad, message in (("likelihood/utterance+other", "only 'control'"), ("likelihood/words", "likelihood_match"),
                         ("likelihood/utterance+costly", "not cost<number>"), ("likelihood/pair+cost-1", "save_cost")):
        config.experiments.judges = (bad,)
        with pytest.raises(ValueError, match=message):
            run_experiment("judges", config, tmp_path / "exp", [0], log=lambda line: None)


def test_rejudge_rejudges_every_system_and_identical_judges_agree(workdir):
    _, content = _run("rejudge", workdir)
    assert list(content["rows"]) == ["ours", *BASELINES]
    agreement = content["extra"]["agreement_with_first_judge"]["judge"]["0"]
    assert agreement["pearson_per_reply"] == pytest.approx(1.0)  # "judge" is the offline judge too
    assert _mean(content, "ours", "offline|mean") == _mean(content, "ours", "judge|mean")


def test_exploration_reports_the_online_stages_rows_per_training_session(workdir, tmp_path):
    from icml_jax.experiments.catalog import EXPLORATION_KEYS, training_session_rows

    _, content = _run("exploration", workdir)
    logged = [r for r in read_metrics(workdir / "seed0" / "ours" / "metrics.jsonl")
              if r.get("table") == "sessions" and r.get("phase") == "online"]
    assert list(content["rows"]) == [f"session {n}" for n in range(1, 7)]  # the demo world's 6 sessions, all trained
    assert [r["session"] for r in logged] == list(range(1, 7))
    for r in logged:  # the training rows, not an evaluation after training
        assert content["rows"][f"session {r['session']}"]["per_seed"]["0"] == {k: r[k] for k in EXPLORATION_KEYS}
    assert any(r["planner_miss_rate"] is not None for r in logged) and sum(r["saves_finalized"] for r in logged) > 0
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"stage": "online", "table": "sessions", "phase": "online",
                                                        "session": 1, "planner_miss_rate": 0.5}) + "\n")
    with pytest.raises(ValueError, match="lack \\['planner_false_positive_rate'"):
        training_session_rows(tmp_path)


def test_lambda_runs_one_variant_per_weight(workdir):
    _, content = _run("lambda", workdir)
    assert list(content["rows"]) == ["0", "0.5"]
    config = json.loads((workdir / "seed0" / "lambda_0" / "config.json").read_text())
    assert config["rl"]["reward"]["truth_lambda"] == 0.0


def test_synthesis_direction_compares_backward_and_forward(workdir):
    _, content = _run("synthesis_direction", workdir)
    assert list(content["rows"]) == ["backward (ours)", "forward"]
    manifest = json.loads((workdir / "seed0" / "base_forward" / "synthesis" / "manifest.json").read_text())
    assert manifest["direction"] == "forward"


def test_size_grid_has_a_cell_per_pair_and_a_figure(workdir):
    files, content = _run("size_grid", workdir)
    assert list(content["rows"]) == ["h64 x h64", "h64 x h32", "h32 x h64", "h32 x h32"]
    assert files["png"].stat().st_size > 0
    cell = json.loads((workdir / "seed0" / "grid_h64_x_h32" / "config.json").read_text())["model"]
    assert (cell["hidden"], cell["trigger_hidden"]) == (64, 32)


def test_ten_sessions_plots_every_session(workdir):
    files, content = _run("ten_sessions", workdir)
    assert list(content["rows"]) == [f"session {n}" for n in range(1, 5)]
    assert files["png"].stat().st_size > 0


def test_policy_maps_before_and_after(workdir):
    files, content = _run("policy_maps", workdir)
    assert list(content["rows"]) == ["untrained", "warm-up", "online"]
    maps = content["extra"]["maps"]["0"]["policies"]
    assert _mean(content, "untrained", "save_prob_gold") == pytest.approx(0.5)  # zero heads: p = 1/2
    assert maps["online"]["turns"] and maps["online"]["queries"]
    assert any(any(q["needed"]) for q in maps["online"]["queries"])
    assert files["png"].stat().st_size > 0


def test_two_seeds_report_mean_and_spread(workdir):
    _, content = _run("lambda", workdir, seeds=(0, 1))
    stats = content["rows"]["0.5"]["aggregate"]["trigger_recall"]
    assert stats["n"] == 2 and stats["sd"] is not None
    assert set(content["rows"]["0.5"]["per_seed"]) == {"0", "1"}


def test_locomo_asks_every_system_every_question_and_tests_them_in_pairs(workdir, monkeypatch):
    import ml_collections

    from icml_jax.evaluation import locomo_scoring
    from icml_jax.experiments import locomo

    fixture = ROOT / "tests" / "data" / "fixtures" / "locomo" / "locomo10.json"
    systems = ("ours", "no_memory", "dense@1", "dense@3", "evidence_oracle")
    config = smoke_config()
    config.experiments.locomo = ml_collections.ConfigDict(dict(file=str(fixture), answered=4, systems=systems))
    files = run_experiment("locomo", config, workdir, [0], log=lambda line: None)
    content = json.loads(files["json"].read_text(encoding="utf-8"))
    assert list(content["rows"]) == list(systems)
    recall = {name: _mean(content, name, "evidence_recall") for name in systems}
    assert recall["evidence_oracle"] == 1.0 and recall["no_memory"] == 0.0
    assert recall["dense@3"] >= recall["dense@1"] > 0.0
    for name in systems:  # every question recalled for, 4 of conv-1's and conv-2's one answered, rows recompute
        rows = locomo.read_rows(workdir / "seed0" / f"locomo_{name}")
        assert len(rows) == 12 and sum(r["answered"] for r in rows) == 5
        for row in rows:
            if row["answered"]:
                assert row["f1"] == locomo_scoring.locomo_f1(row["prediction"], row["answer"] or "",
                                                             row["category"])
            assert row["evidence_recall"] == locomo_scoring.evidence_recall(row["evidence"], row["reached"])
    # each system's own record (a baseline's malformed-answer counts) is kept beside its rows
    dense = json.loads((workdir / "seed0" / "locomo_dense@1" / "results.json").read_text(encoding="utf-8"))["agent"]
    assert dense["baseline"] == "dense" and dense["malformed_answers"] == {}
    tests = content["extra"]["paired_tests"]
    assert {"ours vs no_memory: evidence_recall", "dense@1 vs ours: f1"} <= set(tests)
    assert "Published LoCoMo numbers" in files["md"].read_text(encoding="utf-8")
    monkeypatch.setattr(locomo, "play_qa", lambda *a, **k: pytest.fail("a rerun plays nothing again"))
    assert json.loads(run_experiment("locomo", config, workdir, [0], log=lambda line: None)["json"].read_text(
        encoding="utf-8"))["rows"] == content["rows"]
    config.experiments.locomo.systems = systems[1:3]  # fewer systems: each one's results are still read back
    stored = workdir / "seed0" / "locomo_dense@1" / "results.json"  # written before rl.reward.likelihood_control
    original = stored.read_text(encoding="utf-8")
    old = json.loads(original)  # and experiments.ablations existed
    del old["setting"]["config"]["rl"]["reward"]["likelihood_control"], old["setting"]["config"]["experiments"]
    old["setting"]["config"]["data"]["train_episodes"] += 4  # how long ours trained: not a baseline's setting
    old["setting"]["config"]["checkpoint"]["keep"] += 1
    stored.write_text(json.dumps(old), encoding="utf-8")
    again = json.loads(run_experiment("locomo", config, workdir, [0], log=lambda line: None)["json"].read_text(
        encoding="utf-8"))["rows"]
    assert again == {name: content["rows"][name] for name in systems[1:3]}
    old["setting"]["config"]["rl"]["reward"]["likelihood_control"] = True  # a real difference: played again
    stored.write_text(json.dumps(old), encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="a rerun plays nothing again"):
        run_experiment("locomo", config, workdir, [0], log=lambda line: None)
    stored.write_text(original, encoding="utf-8")
    config.experiments.locomo.systems = ("ours",)  # ours' rows do depend on how long it trained: played again
    ours = workdir / "seed0" / "locomo_ours" / "results.json"
    original = ours.read_text(encoding="utf-8")
    old = json.loads(original)
    old["setting"]["config"]["data"]["train_episodes"] += 4
    ours.write_text(json.dumps(old), encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="a rerun plays nothing again"):
        run_experiment("locomo", config, workdir, [0], log=lambda line: None)
    ours.write_text(original, encoding="utf-8")


def test_locomo_sessions_cuts_every_conversation_and_keeps_the_questions_it_can_answer():
    """`experiments.locomo.sessions`: each conversation's first n sessions and the questions answerable from them;
    recorded only when set (runs made before it are read back); a bad value is one error naming the key."""
    import dataclasses

    import ml_collections

    from icml_jax.data.sources.locomo import first_sessions, questions
    from icml_jax.experiments.locomo import LocomoSettings, conversations

    fixture = ROOT / "tests" / "data" / "fixtures" / "locomo" / "locomo10.json"
    block = lambda **kw: ml_collections.ConfigDict({"experiments": {"locomo": dict(file=str(fixture), **kw)}})  # noqa: E731
    settings = LocomoSettings.from_config(block(sessions=2))
    whole = conversations(dataclasses.replace(settings, sessions=None))
    cut = conversations(settings)
    assert [e.episode_id for e in cut] == [e.episode_id for e in whole] and len(cut) == 2
    for c, w in zip(cut, whole, strict=True):
        assert c.sessions == w.sessions[:2] and questions(c) == questions(first_sessions(w, 2))
    assert sum(map(len, map(questions, cut))) < sum(map(len, map(questions, whole)))
    assert settings.record()["sessions"] == 2 and "sessions" not in LocomoSettings.from_config(block()).record()
    for bad in (0, True, "2"):
        with pytest.raises(ValueError, match=r"experiments.locomo.sessions must be a positive integer"):
            LocomoSettings.from_config(block(sessions=bad))
    with pytest.raises(ValueError, match="LongMemEval"):
        LocomoSettings.from_config(block(sessions=2, format="longmemeval"))


def test_ours_online_learns_from_locomos_sessions_and_never_sees_a_question_answer_or_evidence(workdir, monkeypatch):
    """The learning arm: Algorithm 1 on each conversation's sessions, an update before its questions; no
    question, gold answer or evidence id reaches a decision, a training record or any back-end request."""
    import ml_collections

    from icml_jax.data.sources.locomo import parse_locomo, questions
    from icml_jax.llm.offline import OfflineBackend
    from icml_jax.rl.learner import OnlineLearner

    fixture = ROOT / "tests" / "data" / "fixtures" / "locomo" / "locomo10.json"
    conversations = list(parse_locomo(fixture))
    qa = [q for e in conversations for q in questions(e)]
    secret = {q.question for q in qa} | {q.answer for q in qa if q.answer and len(q.answer) > 6} | {"evidence"}
    played, updates, sent = [], [], []
    step, update, generate = OnlineLearner.step_turns, OnlineLearner.update, OfflineBackend.generate
    monkeypatch.setattr(OnlineLearner, "step_turns", lambda self, turns, *a: (played.extend(turns),
                                                                              step(self, turns, *a))[1])
    monkeypatch.setattr(OnlineLearner, "update", lambda self: (updates.append(list(self._turns)), update(self))[1])
    monkeypatch.setattr(OfflineBackend, "generate", lambda self, rs: (sent.extend(rs), generate(self, rs))[1])
    config = smoke_config()
    config.experiments.locomo = ml_collections.ConfigDict(dict(file=str(fixture), answered=2,
                                                               systems=("ours_online",)))
    content = json.loads(run_experiment("locomo", config, workdir, [0], log=lambda line: None)["json"].read_text(
        encoding="utf-8"))
    updates = [batch for batch in updates if batch and batch[0].receipt.episode_id.startswith("conv-")]
    assert content["rows"]["ours_online"]["per_seed"]["0"]["evidence_recall"] is not None
    turns = sum(len(s.turns) for e in conversations for s in e.sessions)
    assert len(played) == turns and len(updates) == len(conversations) == 2  # every turn; one update each
    stored = json.loads((workdir / "seed0" / "locomo_ours_online" / "results.json").read_text(encoding="utf-8"))
    index = [u["update/index"] for u in stored["updates"]]  # each update's metrics kept with the rows
    assert len(index) == 2 and index[1] == index[0] + 1
    assert all(not set(e.meta) & {"qa", "annotations"} for e, *_ in played)
    for record in (r for batch in updates for r in batch):
        assert not any(text in record.receipt.utterance for text in secret)
    learner_requests = [r for r in sent if r.task != "locomo_answer"]
    assert learner_requests and not any(text in json.dumps([r.prompt, r.system, dict(r.metadata)], default=str)
                                        for r in learner_requests for text in secret)


def test_every_experiment_is_tested_here():
    tested = {"main", "ablation", "synthetic_scale", "judges", "rejudge", "exploration", "lambda",
              "synthesis_direction", "size_grid", "ten_sessions", "policy_maps", "table6", "efficiency", "locomo"}
    assert set(EXPERIMENTS) == tested


def test_seeds_flag_takes_space_separated_values():
    assert _seeds_argv(["x", "--seeds", "0", "1", "2", "--workdir=w"]) == ["x", "--seeds=0,1,2", "--workdir=w"]


def test_unknown_override_path_is_an_error():
    with pytest.raises(KeyError, match="no field 'nope'"):
        runs.derive(smoke_config(), {"rl.nope": 1})


def test_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "icml_jax.experiments", "--experiment=ten_sessions",
                           f"--config={ROOT / 'configs' / 'gc.py'}", f"--workdir={tmp_path}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "experiment error: ten_sessions needs the persona world" in proc.stderr
    # a bad override: one line naming the flag (the shared parser of icml_jax.run.cli), not a traceback
    typo = subprocess.run([sys.executable, "-m", "icml_jax.experiments", "--experiment=ten_sessions",
                           f"--config={ROOT / 'configs' / 'gc.py'}", f"--workdir={tmp_path}",
                           "--config.learner.update_evry=2"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert typo.returncode == 2 and typo.stderr.strip().splitlines() == [typo.stderr.strip()], typo.stderr[-2000:]
    assert typo.stderr.startswith("experiment error: --config.learner.update_evry: no such key"), typo.stderr


def test_judge_notes_call_only_the_offline_judge_an_oracle():
    """The tables' note on the judged columns follows the config's back ends: the oracle note for the offline
    judge only; a real judge is named with what it reads; the offline generator is said not to be an LLM."""
    import ml_collections

    from icml_jax.experiments.catalog import ORACLE, judge_notes

    config = smoke_config()
    assert judge_notes(config) == [ORACLE]
    config.llm.judge = ml_collections.ConfigDict(dict(kind="local", model_dir="/m/smollm2", judge_mode="scores"))
    notes = judge_notes(config)
    assert ORACLE not in notes and "smollm2" in notes[0] and "score-token" in notes[0]
    assert "oracle" not in " ".join(notes) and "no LLM wrote them" in notes[-1]  # demo: the offline generator
    config.llm.generator = ml_collections.ConfigDict(dict(kind="local", model_dir="/m/smollm2"))
    assert len(judge_notes(config)) == 1


@pytest.mark.parametrize("name", ["demo", "gc_smollm2", "base"])
@pytest.mark.parametrize("switch", [None, "generator", "judge"])
def test_setting_of_records_the_back_ends_as_the_raw_blocks_did(name, switch):
    """results.json's setting names the back ends as before the `llm` block was typed (old runs are compared with
    it): set_options of each raw block, the offline judge named an oracle; also with a role switched to a keyless
    OpenAI-compatible server (--config.llm.<role>.kind=openai ...)."""
    from icml_jax.configlib import apply_overrides
    from icml_jax.experiments.runner import setting_of

    config = load_config(name)
    if switch:
        apply_overrides(config, {f"llm.{switch}.kind": "openai", f"llm.{switch}.base_url": "http://127.0.0.1:1/v1",
                                 f"llm.{switch}.model": "served", f"llm.{switch}.api_key_env": ()})
    judge = set_options(config.llm.judge)  # the code path before RunSpec.llm
    old = {"generator": set_options(config.llm.generator),
           "judge": "offline (an oracle: it reads the data's labels)" if judge.get("kind") == "offline" else judge}
    assert {k: setting_of(config)[k] for k in old} == old
