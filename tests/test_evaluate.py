"""`python -m icml_jax.evaluate` on a warmed-up tiny demo: the protocol's targets, metrics that recompute from
targets.jsonl with sacrebleu / rouge-score directly, Table 8 columns, and a rerun that asks no back end again."""

from __future__ import annotations

import io
import json

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from icml_jax import evaluate as ev
from icml_jax import main as job
from icml_jax.data.stream import held_out_episodes
from icml_jax.evaluation.report import RESULTS_JSON, RESULTS_MD, TABLE8, TARGETS_JSONL, read_targets
from tests.test_main import tiny_demo


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    config = tiny_demo()
    config.mode = ("synthesize", "warmup")
    workdir = tmp_path_factory.mktemp("run")
    job.run(config, workdir, out=io.StringIO())
    return config, workdir


def test_evaluation_writes_recomputable_results_and_reruns_from_its_cache(warmed):
    config, workdir = warmed
    content = ev.evaluate_workdir(config, workdir)
    out = workdir / ev.EVAL_DIR
    rows = [json.loads(line) for line in (out / TARGETS_JSONL).read_text().splitlines()]
    episodes = held_out_episodes(config)
    assert len(rows) == content["targets"] == sum(len(e.sessions[-1].turns) - 1 for e in episodes)
    assert {r["episode_id"] for r in rows} == {e.episode_id for e in episodes}
    by_id = {e.episode_id: e for e in episodes}
    for r in rows:  # the reference is the gold turn; the utterance the gold turn before it
        turns = by_id[r["episode_id"]].sessions[r["session"]].turns
        assert r["session"] == len(by_id[r["episode_id"]].sessions) - 1 and r["turn"] >= 1
        assert (r["reference"], r["utterance"]) == (turns[r["turn"]].text, turns[r["turn"] - 1].text)
    replies, refs = [r["reply"] for r in rows], [r["reference"] for r in rows]
    gen = content["generation"]
    assert gen["BLEU-4"] == pytest.approx(sacrebleu.corpus_bleu(replies, [refs]).score)
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge = [scorer.score(g, r)["rougeL"].fmeasure for r, g in zip(replies, refs, strict=True)]
    assert gen["ROUGE-L"] == pytest.approx(100 * sum(rouge) / len(rouge))
    assert [r["rouge_l"] for r in rows] == pytest.approx([100 * x for x in rouge])  # per target too
    # Table 8 per history session and pooled; the persona world has labels, so recall is measurable
    assert len(content["memory_per_session"]) == len(episodes[0].sessions)
    assert all(k in content["memory"] for k in TABLE8) and content["memory"]["needed_pairs"] > 0
    pt = content["memory"]["proxy_truth"]  # proxy vs truth reward of the saves that replies used
    assert pt["proxy_failures"] == 0 and 0 <= pt["saves_used"] <= pt["saves"]  # numbers: tests/evaluation
    assert pt["r"] is None or -1 <= pt["r"] <= 1
    assert len(content["efficiency"]["storage_tokens_per_session"]) == len(episodes[0].sessions) - 1
    # the judge's five dimensions, one verdict per target (the offline judge: an oracle reading the labels)
    assert gen["judge"] == {"judged": len(rows), "failures": 0, "backend_failures": 0} and "oracle" in content["setting"]["judge"]
    for dim in ("Engagingness", "Humanness", "Coherence", "Consistency", "Memorability"):
        want = 100 * sum(r["judge"][dim.lower()] for r in rows) / len(rows)
        assert gen[dim] == pytest.approx(want) and 0 <= gen[dim] <= 100
    md = (out / RESULTS_MD).read_text()
    assert "| BLEU-4 | ROUGE-L | BERTScore | MAUVE |" in md and "sacrebleu" in md
    assert (out / "efficiency.png").read_bytes()[:4] == b"\x89PNG"
    usage = content["setting"]["llm_usage"]  # the run's own calls: every target's reply and verdict at least
    assert usage["judge"]["calls"] == len(rows) and usage["generator"]["calls"] >= len(rows)
    assert usage["generator"]["prompt_tokens"] > 0 and "estimated_usd" not in usage["generator"]
    per_session = content["efficiency"]["per_session"]  # Figures 9, 10, 15: the generator's tokens by session
    assert [r["session"] for r in per_session] == list(range(1, len(episodes[0].sessions) + 1))
    assert sum(r["calls"] for r in per_session) * len(episodes) == pytest.approx(usage["generator"]["calls"])
    assert per_session[-1]["calls"] * len(episodes) >= len(rows) and per_session[-1]["construction_ms"] is None
    assert all(r["processing_s"] > 0 for r in per_session) and "| session | generator tokens |" in md
    sent = content["setting"]["backend_requests"]["sent"]
    assert sent > 0
    again = ev.evaluate_workdir(config, workdir)
    assert again["setting"]["backend_requests"] == {"sent": 0, "from_cache": sent + content["setting"][
        "backend_requests"]["from_cache"]}
    assert again["generation"] == content["generation"] and again["memory"] == content["memory"]
    assert again["setting"]["llm_usage"] == usage  # cached answers still count as the evaluation's cost
    assert json.loads((out / RESULTS_JSON).read_text())["targets"] == len(rows)
    # against itself: every target judged pairwise, all ties, the verdicts and the order on disk
    versus = ev.evaluate_workdir(config, workdir, against=workdir)["pairwise"]
    assert versus["preference"]["ties"] == len(rows) and versus["failures"] == 0
    assert (out / f"pairwise_{workdir.name}_vs_{workdir.name}.md").is_file()


def test_bertscore_and_mauve_from_local_models_recompute_from_targets(warmed, tmp_path):
    from bert_score import score

    from icml_jax.evaluation.model_metrics import last_token_features, mauve_score
    from icml_jax.models import from_pretrained, load_tokenizer
    from tests.evaluation.test_model_metrics import write_tiny_bert
    from tests.models import hf_fixtures, tokenizer_fixtures

    config, workdir = warmed
    bert, llama = write_tiny_bert(tmp_path / "bert"), tmp_path / "llama"
    hf_fixtures.build("llama", llama)
    tokenizer_fixtures.build_tokenizer(llama)
    config = config.copy_and_resolve_references()
    config.eval.bertscore_model, config.eval.bertscore_layer, config.eval.mauve_model = str(bert), 2, str(llama)
    content = ev.evaluate_workdir(config, workdir)
    rows = [json.loads(line) for line in (workdir / ev.EVAL_DIR / TARGETS_JSONL).read_text().splitlines()]
    replies, refs = [r["reply"] for r in rows], [r["reference"] for r in rows]
    gen = content["generation"]
    f1 = score(replies, refs, model_type=str(bert), num_layers=2, use_fast_tokenizer=True)[2]
    assert gen["BERTScore"] == pytest.approx(100 * float(f1.mean()), abs=1e-4)
    rows = [json.loads(line) for line in (workdir / ev.EVAL_DIR / TARGETS_JSONL).read_text().splitlines()]
    assert [r["bertscore_f1"] for r in rows] == pytest.approx([100 * float(x) for x in f1], abs=1e-4)
    model, tok = from_pretrained(str(llama)), load_tokenizer(str(llama))
    want = mauve_score(last_token_features(model, tok, replies), last_token_features(model, tok, refs),
                       seed=int(config.seed)).value
    assert gen["MAUVE"] == pytest.approx(want, abs=1e-6) and 0 <= gen["MAUVE"] <= 100
    assert "layer 2" in gen["signatures"]["BERTScore"] and "llama" in gen["signatures"]["MAUVE"]
    assert "not computed" not in (workdir / ev.EVAL_DIR / RESULTS_MD).read_text()


def test_learning_during_the_evaluation_updates_the_policy_before_each_groups_final_sessions(warmed, tmp_path,
                                                                                           monkeypatch):
    """eval.learn with users_in_flight=2: the history sessions of two episodes at a time in one batched learner
    step per tick (protocol.play_group), one update that changes the policy before their targets."""
    import shutil

    import jax
    import numpy as np
    from flax import nnx

    from icml_jax.rl.learner import OnlineLearner

    config, workdir = warmed
    work = tmp_path / "run"
    shutil.copytree(workdir, work, ignore=shutil.ignore_patterns(ev.EVAL_DIR))
    config = config.copy_and_resolve_references()
    config.eval.learn = True
    config.learner.update_every = config.learner.users_in_flight = 2
    changed, real_update = [], OnlineLearner.update

    def spy(self):  # each update must change the policy's parameters
        before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(self.policies, nnx.Param))]
        out = real_update(self)
        after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(self.policies, nnx.Param))]
        changed.append(any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True)))
        return out

    monkeypatch.setattr(OnlineLearner, "update", spy)
    content = ev.evaluate_workdir(config, work)
    episodes = held_out_episodes(config)
    groups = -(-len(episodes) // 2)
    assert len(episodes) >= 2 and content["setting"]["learning"] == {"online": True, "updates": groups}
    assert changed == [True] * groups
    assert content["targets"] == sum(len(e.sessions[-1].turns) - 1 for e in episodes)


def test_a_frozen_policy_in_lockstep_gives_the_sequential_evaluation(warmed, tmp_path, monkeypatch):
    """users_in_flight=2: the greedy policy plays two episodes' history sessions per batched step (Trigger, Planner,
    notes); every target row and every per-session count is the one sequential play gives."""
    import shutil

    from icml_jax.evaluation.protocol import PolicyAgent

    config, workdir = warmed
    rows, batches, many = {}, [], PolicyAgent.observe_many
    monkeypatch.setattr(PolicyAgent, "observe_many", lambda self, items: (batches.append(len(items)),
                                                                          many(self, items))[1])
    for users in (1, 2):
        work = tmp_path / f"run{users}"
        shutil.copytree(workdir, work, ignore=shutil.ignore_patterns(ev.EVAL_DIR))
        cfg = config.copy_and_resolve_references()
        cfg.learner.update_every = cfg.learner.users_in_flight = users
        content = ev.evaluate_workdir(cfg, work)
        timing = ("retrieval_ms", "generation_ms")
        rows[users] = ([{k: v for k, v in r.items() if k not in timing}
                        for r in read_targets(work / ev.EVAL_DIR)], content["memory"])
    assert rows[1] == rows[2] and len(rows[1][0]) > 0 and max(batches) == 2  # batched only at users_in_flight=2


def test_command_line(warmed, tmp_path):
    """`python -m icml_jax.evaluate` runs as users call it (flags shared with the main job), and an empty
    workdir is one clear error."""
    import subprocess
    import sys
    from pathlib import Path

    config, workdir = warmed
    root = Path(__file__).resolve().parents[1]
    overrides = [f"--config.{k}={v}" for k, v in (("synthesis.num_seeds", config.synthesis.num_seeds),
                                                     ("data.train_episodes", config.data.train_episodes),
                                                     ("data.eval_episodes", config.data.eval_episodes))]
    cmd = [sys.executable, "-m", "icml_jax.evaluate", f"--config={root / 'configs' / 'demo.py'}", *overrides]
    done = subprocess.run([*cmd, f"--workdir={workdir}"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "targets in" in done.stdout and "results.md" in done.stdout
    empty = subprocess.run([*cmd, f"--workdir={tmp_path}"], cwd=root, capture_output=True, text=True, timeout=300)
    assert empty.returncode == 2 and "no trained policy" in empty.stderr


def test_through_gemini_on_loopback_a_crash_and_rerun_ask_no_request_twice(warmed, tmp_path, monkeypatch):
    """Replies, notes and verdicts from the fake Gemini server; the server fails for good after 25 answers, the
    rerun finishes, and every answer the server ever gave was asked for exactly once."""
    import shutil
    import threading
    from http.server import ThreadingHTTPServer

    import ml_collections

    from icml_jax.evaluation.cache import ResponseCache
    from tests.llm.conftest import TEST_KEY, FakeGemini, _handler, ok, status

    config, workdir = warmed
    work = tmp_path / "run"
    shutil.copytree(workdir, work, ignore=shutil.ignore_patterns(ev.EVAL_DIR))
    monkeypatch.setenv("GEMINI_API_KEY", TEST_KEY)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    verdict = json.dumps({"reason": "ok", "engagingness": 4, "humanness": 5, "coherence": 4, "consistency": 3,
                          "memorability": 2})
    state, lock, answered, limit = FakeGemini(), threading.Lock(), [0], [25]

    def respond(body):
        with lock:
            if limit[0] is not None and answered[0] >= limit[0]:
                return status(400, "simulated outage")
            answered[0] += 1
        return ok(verdict if "responseMimeType" in json.dumps(body) else "Sounds good, tell me more.")

    state.responder = respond
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        config = config.copy_and_resolve_references()
        block = dict(kind="gemini", model="gemini-2.5-flash", base_url=state.base_url, max_attempts=1,
                     max_concurrency=4)
        config.llm.generator = ml_collections.ConfigDict(block)
        config.llm.judge = ml_collections.ConfigDict(block)
        # the outage lands in the judging: each failed verdict is counted, and past eval.max_failed_fraction the
        # evaluation stops with one message (replies and answered verdicts stay cached)
        with pytest.raises(ev.EvaluationError, match=r"judge requests failed after all retries .*simulated outage"):
            ev.evaluate_workdir(config, work)
        assert answered[0] == 25
        limit[0] = None
        content = ev.evaluate_workdir(config, work)
    finally:
        server.shutdown()
        server.server_close()
    cache = ResponseCache(work / ev.EVAL_DIR / ev.CACHE_FILE)
    try:
        assert answered[0] == len(cache)  # every answer the server gave is stored once: none was asked twice
    finally:
        cache.close()
    assert content["setting"]["backend_requests"]["sent"] == answered[0] - 25
    assert content["generation"]["judge"] == {"judged": content["targets"], "failures": 0, "backend_failures": 0}
    assert content["setting"]["llm_usage"]["judge"]["calls"] == content["targets"]
    assert content["generation"]["Humanness"] == pytest.approx(100.0)  # (5 - 1) / 4, the server's verdict


def test_an_evaluation_killed_mid_run_resumes_without_asking_the_server_anything_twice(warmed, tmp_path):
    """`python -m icml_jax.evaluate` through the fake Gemini server, SIGKILLed after 27 requests (inside the
    judge's verdicts), run again to the end: nothing answered and stored before the kill is asked again."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import threading
    import time
    from http.server import ThreadingHTTPServer
    from pathlib import Path

    from icml_jax.evaluation.cache import ResponseCache
    from tests.llm.conftest import TEST_KEY, FakeGemini, _handler, ok

    config, workdir = warmed
    work = tmp_path / "run"
    shutil.copytree(workdir, work, ignore=shutil.ignore_patterns(ev.EVAL_DIR))
    verdict = json.dumps({"reason": "ok", "engagingness": 3, "humanness": 3, "coherence": 3, "consistency": 3,
                          "memorability": 3, "score": 0.5})
    state, lock, answered = FakeGemini(), threading.Lock(), [0]

    def respond(body):
        with lock:
            answered[0] += 1
        return ok(verdict if "responseMimeType" in json.dumps(body) else "Sounds good.")

    state.responder, state.delay_s = respond, 0.05
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "gemini_demo.py").write_text(f"""
import importlib.util
import ml_collections
spec = importlib.util.spec_from_file_location("demo", {str(root / "configs" / "demo.py")!r})
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)

def get_config():
    config = demo.get_config()
    config.synthesis.num_seeds = {config.synthesis.num_seeds}
    config.data.train_episodes, config.data.eval_episodes = {config.data.train_episodes}, {config.data.eval_episodes}
    block = dict(kind="gemini", model="gemini-2.5-flash", base_url={state.base_url!r}, max_attempts=1,
                 max_concurrency=2)
    config.llm.generator = ml_collections.ConfigDict(block)
    config.llm.judge = ml_collections.ConfigDict(block)
    return config
""")
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_API_KEY"} | {"GEMINI_API_KEY": TEST_KEY}
    cmd = [sys.executable, "-m", "icml_jax.evaluate", f"--config={tmp_path / 'gemini_demo.py'}", f"--workdir={work}"]
    try:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 240
        while answered[0] < 27 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, f"ended before the kill point: {proc.stderr.read().decode()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = answered[0]
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        server.shutdown()
        server.server_close()
    cache = ResponseCache(work / ev.EVAL_DIR / ev.CACHE_FILE)
    try:
        # every answer stored before the kill was kept; asked again: only the requests in flight at the kill (at
        # most max_concurrency = 2) and answers read but not yet committed (at most 2 more). Caching whole batches
        # loses the batch's answers instead (measured: 9 asked again).
        assert 27 <= first < answered[0] and 0 <= answered[0] - len(cache) <= 4
    finally:
        cache.close()
    content = json.loads((work / ev.EVAL_DIR / "results.json").read_text())
    assert content["generation"]["judge"]["failures"] == 0 and content["generation"]["Humanness"] == 50.0


def test_auto_selection_takes_theanines_ids_for_msc_and_cc_where_they_are():
    from tests.config_files import load_config

    from icml_jax.data.protocol import shared_data_dir

    for name, dataset in (("cc", "cc"), ("msc", "msc"), ("gc", "gapchat")):
        config = load_config(name)
        assert config.eval.selection == "auto" and config.data.name == dataset
        has_ids = (shared_data_dir() / dataset / "theanine_eval_ids.json").is_file()
        assert ev.eval_selection(config) == ("theanine" if dataset != "gapchat" and has_ids else "seeded")
        config.eval.selection = "seeded"
        assert ev.eval_selection(config) == "seeded"


def test_a_few_failed_back_end_requests_are_tolerated_past_the_fraction_the_evaluation_stops(tmp_path):
    """Judge requests (or episodes) that failed for good are recorded (left out of the means, counted in
    results.json); past eval.max_failed_fraction the evaluation stops with one message saying where the answers
    are kept."""
    failure = "back end: gemini back end failed after 9 attempt(s) of 9: HTTP 429"
    config = tiny_demo()
    ev._check_failures(config, "judge requests", [{"judge_failure": failure}] * 2, 20, tmp_path / "c.sqlite",
                       "judge_failure")  # 10%: tolerated
    with pytest.raises(ev.EvaluationError, match=r"3 of 20 judge requests failed after all retries \(15.0% > "
                                                 r"eval.max_failed_fraction=0.1\); first: back end: .*HTTP 429.* "
                                                 r"cached in .*c.sqlite: rerun"):
        ev._check_failures(config, "judge requests", [{"judge_failure": failure}] * 3, 20, tmp_path / "c.sqlite",
                           "judge_failure")
    config.eval.max_failed_fraction = 0.5
    ev._check_failures(config, "judge requests", [{"judge_failure": failure}] * 3, 20, tmp_path / "c.sqlite",
                       "judge_failure")


def test_an_episode_whose_back_end_request_fails_for_good_is_skipped_and_recorded(warmed, tmp_path):
    """The generator fails for good on one episode's requests (here: every request of the second episode):
    that episode is skipped and listed in results.json with its error, the others are evaluated; with more
    failures than eval.max_failed_fraction the evaluation stops."""
    import shutil

    from icml_jax.llm.offline import OfflineBackend
    from icml_jax.llm.types import BackendError

    config, workdir = warmed
    episodes = ev.eval_episodes(config)
    doomed = episodes[1].episode_id
    real = OfflineBackend.generate

    def flaky(self, requests):
        if any(doomed in str(r.metadata) or doomed in r.prompt for r in requests):
            raise BackendError("offline", 9, 9, f"HTTP 503 for {doomed}", True)
        return real(self, requests)

    work = tmp_path / "run"
    shutil.copytree(workdir, work, ignore=shutil.ignore_patterns(ev.EVAL_DIR))
    config = config.copy_and_resolve_references()
    config.eval.max_failed_fraction = 0.5
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OfflineBackend, "generate", flaky)
        content = ev.evaluate_workdir(config, work)
        assert content["setting"]["failed_episodes"] == [{"episode_id": doomed, "error": f"offline back end: "
                                                          "request failed after 9 attempt(s) of 9 (retries "
                                                          f"exhausted); last error: HTTP 503 for {doomed}"}]
        assert content["episodes"] == len(episodes) - 1
        config.eval.max_failed_fraction = 0.0
        shutil.rmtree(work / ev.EVAL_DIR)
        with pytest.raises(ev.EvaluationError, match=r"1 of \d+ episodes \(a reply or memory request\) failed"):
            ev.evaluate_workdir(config, work)


def test_the_evaluation_caches_each_role_under_its_raw_blocks_namespace(tmp_path):
    """The answer cache's namespaces (its keys) are answer_namespace of the raw blocks, as before the `llm` block
    was typed: a changed key would silently ask every back end again."""
    from icml_jax.llm.cache import ResponseCache, answer_namespace
    from icml_jax.run.runspec import RunSpec

    config = tiny_demo()
    cache = ResponseCache(tmp_path / ev.CACHE_FILE)
    _, generator, judge = ev._cached_backends(RunSpec.from_config(config), cache)
    try:
        for backend, block in ((generator, config.llm.generator), (judge, config.llm.judge)):
            assert backend.namespace == json.dumps(answer_namespace(block.to_dict()), sort_keys=True)
    finally:
        generator.close()
        judge.close()
        cache.close()


def test_planner_probs_replays_a_runs_evaluation_and_counts_its_save_probabilities(warmed, tmp_path, capsys):
    """scripts/planner_probs.py: the run's own config and checkpoint with a config file's eval block, played
    without the judge and the model metrics; its counts are results.json's `setting.planner` and agree with the evaluation's save rate."""
    from tests.scripts_loader import load_script

    _, workdir = warmed
    probs = load_script("planner_probs")
    (counts,) = probs.main([str(workdir), "--config", "configs/demo.py", "--out", str(tmp_path / "out"),
                            "--json", str(tmp_path / "p.json")])
    assert counts["checkpoint"].endswith("warmup")  # the warmed run has no online policy: its warm-up
    assert counts["decisions"] > 0 and sum(counts["histogram"]) == counts["decisions"]
    assert counts["saved"] / counts["decisions"] == pytest.approx(counts["save_rate"])
    replay = json.loads((tmp_path / "out" / f"{workdir.parent.name}_{workdir.name}" / ev.EVAL_DIR /
                         RESULTS_JSON).read_text())
    assert replay["setting"]["judge"] is None and replay["generation"].get("Engagingness") is None  # played only
    assert replay["setting"]["memory_gain"]["computed"] is False
    assert json.loads((tmp_path / "p.json").read_text()) == [counts]
    assert f"| {workdir} | {counts['decisions']} |" in capsys.readouterr().out
