"""The main job: the demo config end to end, config errors before any stage, and --config overrides."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import ml_collections
import pytest

from icml_jax.run import cli, pipeline
from icml_jax import main as job
from icml_jax.run import workdir as layout
from icml_jax.run.builders import build_models
from icml_jax.run.runlog import METRICS_FILE, json_safe
from icml_jax.run.runspec import RunSpec
from tests.config_files import load_config

ROOT = Path(__file__).resolve().parents[1]


def tiny_demo() -> ml_collections.ConfigDict:
    """The demo made smaller still: 4 seeds of synthesis, one warm-up epoch, 4 online episodes, 2 held out."""
    config = load_config("demo")
    config.synthesis.num_seeds = 4
    config.data.train_episodes = 4
    config.data.eval_episodes = 2
    return config


def read_metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / METRICS_FILE).read_text().splitlines()]


def test_demo_runs_end_to_end(tmp_path, monkeypatch):
    from icml_jax.rl import heldout

    seen_configs, real_evaluate = [], heldout.evaluate

    def spy(*args, agent_config=None, **kw):
        seen_configs.append(agent_config)
        return real_evaluate(*args, agent_config=agent_config, **kw)

    monkeypatch.setattr(heldout, "evaluate", spy)
    config = tiny_demo()
    config.learner.reply_max_tokens, config.learner.note_max_tokens, config.learner.reply_temperature = 40, 24, 0.5
    out = io.StringIO()
    summary = job.run(config, tmp_path, out=out)
    # the held-out agent writes replies and notes as the online one does (lengths, temperature, observation)
    assert seen_configs == [RunSpec.from_config(config).learner.agent] * 2 and seen_configs[0].note_max_tokens == 24
    assert list(summary) == ["synthesize", "warmup", "online"]
    rows = read_metrics(tmp_path)
    stages = [r["stage"] for r in rows]
    assert stages[0] == "synthesize" and stages[-1] == "summary"
    order = ["synthesize", "warmup", "eval", "online", "summary"]
    assert [s for s in stages if s != "eval"] == sorted([s for s in stages if s != "eval"], key=order.index)
    online = [r for r in rows if r["stage"] == "online" and "episode" in r]
    assert [r["episode"] for r in online] == [1, 2, 3, 4]
    assert [r["episodes_seen"] for r in rows if r["stage"] == "eval"] == [0, 4]
    final = [r for r in rows if r.get("final")]
    assert {r["stage"] for r in final} == {"warmup", "online"}
    assert summary["online"]["updates"] == 4
    # issue 16: the synthesis row's token count was always null; back-end retries and failures are logged too
    (syn,) = [r for r in rows if r["stage"] == "synthesize"]
    assert syn["llm/total_tokens"] > 0 and syn["llm/attempts"] >= syn["llm/calls"] > 0
    assert syn["llm/retries"] == syn["llm/failures"] == syn["failed_requests"] == 0
    assert all(r["llm/failures"] == 0 and r["llm/attempts"] > 0 for r in online)
    assert summary["online"]["skipped_steps"] == summary["online"]["rollbacks"] == 0
    assert summary["warmup"]["skipped_steps"] == summary["warmup"]["rollbacks"] == 0
    assert (tmp_path / "warmup" / "warmup.json").is_file() and (tmp_path / "synthesis" / "manifest.json").is_file()
    # the per-session table: held-out before/after and online rows for each of the world's sessions
    table = [r for r in rows if r.get("table") == "sessions"]
    sessions = tiny_demo().data.world.num_sessions
    assert sorted((r["phase"], r["session"]) for r in table) == sorted(
        (p, k) for p in ("before", "online", "after") for k in range(1, sessions + 1))
    # outputs users look at: the plot, TensorBoard events per stage, the trained policy, the progress record
    assert (tmp_path / layout.PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in (tmp_path / "tensorboard").iterdir()} == {"synthesize", "warmup", "eval", "online",
                                                                       "summary"}
    assert (tmp_path / layout.POLICY_DIR / "warmup.json").is_file()
    progress = json.loads((tmp_path / layout.PROGRESS_FILE).read_text())
    assert progress["finished"] and set(progress["done"]) == {"synthesize", "warmup", "online"}
    assert progress["metrics_bytes"] == (tmp_path / METRICS_FILE).stat().st_size
    assert sorted(p.name for p in (tmp_path / layout.CHECKPOINT_DIR).iterdir()) == ["0", "4"]  # the start, the end
    text = out.getvalue()
    assert "icml_jax run finished" in text and "online" in text and "after/eval/trigger_recall" in text
    assert "per session" in text and str(tmp_path / layout.PLOT_FILE) in text

    # a finished run started again does nothing but report
    again = io.StringIO()
    assert job.run(config, tmp_path, out=again) == json_safe(summary)  # as progress.json keeps it
    assert read_metrics(tmp_path) == rows and "per session" in again.getvalue()

    # more episodes extend the finished run from its newest checkpoint: its first 4 episode rows stay as they were
    config.data.train_episodes = 6
    longer = io.StringIO()
    extended = job.run(config, tmp_path, out=longer)
    assert f"extending {tmp_path}: its online stage played 4 episodes, config.data.train_episodes asks for 6" \
        in longer.getvalue() and "(online checkpoint step 4)" in longer.getvalue(), longer.getvalue()
    rows = read_metrics(tmp_path)
    assert [r for r in rows if r["stage"] == "online" and "episode" in r][:4] == online
    assert [r["episode"] for r in rows if r["stage"] == "online" and "episode" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["episodes_seen"] for r in rows if r["stage"] == "eval"] == [0, 6]
    assert [r["stage"] for r in rows].count("summary") == 1 and len([r for r in rows if r.get("final")]) == 2
    assert extended["online"]["episodes"] == extended["online"]["updates"] == 6
    assert extended["warmup"] == json_safe(summary["warmup"])
    assert "6" in {p.name for p in (tmp_path / layout.CHECKPOINT_DIR).iterdir()}
    progress = json.loads((tmp_path / layout.PROGRESS_FILE).read_text())
    assert progress["finished"] and progress["done"]["online"]["episodes"] == 6
    assert progress["metrics_bytes"] == (tmp_path / METRICS_FILE).stat().st_size
    # ... and is never shortened: refused before anything in the workdir changes
    config_json = (tmp_path / layout.CONFIG_FILE).read_text()
    config.data.train_episodes = 5
    with pytest.raises(job.ConfigError, match=r"asks for 5 online episodes, but this workdir's finished run "
                                              r"played 6; a finished run is extended, never shortened"):
        job.run(config, tmp_path)
    assert (tmp_path / layout.CONFIG_FILE).read_text() == config_json and read_metrics(tmp_path) == rows

    # issue 18: forgetting a user of this real run leaves none of their memories in any file of the workdir
    from icml_jax import erasure
    from icml_jax.checkpoint import RunCheckpointer

    with RunCheckpointer(tmp_path / layout.CHECKPOINT_DIR) as ckpt:
        memory = ckpt.restore_state()[1]["memory"]
    user = sorted(memory)[0]
    ids = [json.loads(line)["fragment_id"] for line in memory[user].splitlines()]
    assert ids and any(i.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() for i in ids)
    erasure.forget_user(tmp_path, user)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and any(i.encode() in p.read_bytes() for i in ids)]
    with RunCheckpointer(tmp_path / layout.CHECKPOINT_DIR) as ckpt:  # the rewritten checkpoint still restores
        state = ckpt.restore()[2]
    assert user not in state["memory"] and len(state["memory"]) == len(memory) - 1


def test_workdir_of_another_config_is_refused(tmp_path):
    config = tiny_demo()
    config.mode = ("synthesize",)
    (tmp_path / "config.json").write_text(layout.config_text(config))
    other = tiny_demo()
    with pytest.raises(job.ConfigError, match=r"holds a run with another config \(differs at \['mode'\]\)"):
        job.run(other, tmp_path)


def test_a_workdir_from_before_the_limits_block_resumes_and_the_limits_may_change(tmp_path):
    """config.limits (issue 31) is read by the chat and the Memory API only: a run's config.json written before
    the block existed, or with other limits, is still the same run."""
    config = tiny_demo()
    config.mode = ("synthesize",)
    old = json.loads(layout.config_text(config))
    del old["limits"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    job.validate(config, tmp_path)
    config.limits.max_text_chars = 100
    job.validate(config, tmp_path)
    config.mode = ("synthesize", "warmup")
    with pytest.raises(job.ConfigError, match=r"differs at \['mode'\]"):
        job.validate(config, tmp_path)


def test_a_workdir_from_before_policy_remat_resumes_only_without_remat(tmp_path):
    """A key added later with a behaviour-preserving default (configlib.ADDED_KEYS) reads as that default in a
    config.json that lacks it; any other value is another run."""
    config = tiny_demo()
    config.mode = ("synthesize",)
    old = json.loads(layout.config_text(config))
    del old["policy"]["remat"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    job.validate(config, tmp_path)
    config.policy.remat = "full"
    with pytest.raises(job.ConfigError, match=r"differs at \['policy.remat'\]"):
        job.validate(config, tmp_path)


def _bad(**changes) -> ml_collections.ConfigDict:
    config = tiny_demo()
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


@pytest.mark.parametrize("changes, message", [
    (dict(mode=("online", "ghost")), "unknown or no stage(s) ['ghost']"),
    (dict(mode=("online", "synthesize")), "in the order"),
    (dict(mode=("warmup", "online")), "synthesis/manifest.json does not exist"),
    (dict(model__kind="pretrained"), "config.model.path is not set"),
    (dict(model__kind="pretrained", model__path="/nonexistent/ckpt"), "config.model.path='/nonexistent/ckpt'"),
    (dict(data__name="cc", model__kind="pretrained", model__path=None), "config.data.tfds_name"),
    (dict(checkpoint__every_episodes=3, learner__update_every=2), "config.checkpoint.every_episodes=3"),
    (dict(llm__judge=ml_collections.ConfigDict(dict(kind="gemini", model="gemini-2.5-flash"))),
     "config.llm.judge is a Gemini back end (gemini-2.5-flash): gemini back end: no API key found"),
    (dict(llm__synthesizer=ml_collections.ConfigDict(dict(kind="gemini", model="gemini-2.5-pro"))),
     "config.llm.synthesizer is a Gemini back end (gemini-2.5-pro): gemini back end: no API key found"),
    (dict(llm__judge=ml_collections.ConfigDict(dict(kind="openai", model="gpt-4o-mini"))),
     "config.llm.judge is an OpenAI-compatible back end (gpt-4o-mini): openai back end: no API key found"),
    (dict(llm__judge=ml_collections.ConfigDict(dict(kind="openai", model="m", api_key_env=("MY_VLLM_KEY",)))),
     "openai back end: no API key found; set one of MY_VLLM_KEY; or try it without a key"),
    (dict(parallel__mesh__tensor=jax.device_count() + 1), "config.parallel.mesh: mesh spec"),
    (dict(rl__ppo__clip_eps=-1.0), "config.rl: PPOConfig.clip_eps must be > 0"),
    (dict(synthesis__num_seeds=0), "config.synthesis: SynthesisConfig.num_seeds must be a positive int"),
    # issue 16: each of these used to pass validation and fail (or not) once a stage ran
    (dict(llm__judge=ml_collections.ConfigDict(dict(kind="offline", mdoel="gemini-2.5-pro"))),
     "config.llm.judge: unknown config key(s) ['mdoel'] for the 'offline' back end"),
    (dict(llm__judge=ml_collections.ConfigDict(dict(kind="gemini", model="m", timeout_s=-1.0))),
     "config.llm.judge: GeminiConfig.timeout_s must be > 0"),
    (dict(learner__reply_temperature=-1.0), "AgentConfig.reply_temperature must be a number in [0, 2]"),
    (dict(observation__max_candidates=2), "config.observation.max_candidates=2 is smaller than the memories a "
                                          "synthesized Trigger example shows (1 + synthesis.hard_negatives=1"),
    (dict(learner__divergence__action="ignore"), "config.learner: DivergenceConfig.action must be one of"),
    (dict(warmup__divergence__max_update_ratio=-1.0), "config.warmup: DivergenceConfig.max_update_ratio"),
    (dict(learner__users_in_flight=3), "LearnerConfig.users_in_flight must be a positive int dividing update_every"),
    (dict(limits__max_text_chars=0), "config.limits: TextLimits.max_text_chars must be a positive int, got 0"),
    (dict(observation__prefilter="embedding", observation__prefilter_model="/nonexistent/encoder"),
     "config.observation: observation.prefilter_model='/nonexistent/encoder' is not a directory"),
])
def test_config_errors_come_before_any_stage(tmp_path, monkeypatch, changes, message):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY", "MY_VLLM_KEY"):
        monkeypatch.delenv(name, raising=False)
    called = []
    monkeypatch.setattr(pipeline, "STAGE_FNS", {s: (lambda run, s=s: called.append(s)) for s in job.STAGES})
    workdir = tmp_path / "work"
    with pytest.raises(job.ConfigError) as err:
        job.run(_bad(**changes), workdir)
    assert message in str(err.value)
    assert not called and not workdir.exists()


def test_a_keyless_openai_compatible_server_passes_the_key_check(tmp_path, monkeypatch):
    """`api_key_env=()` (a local vLLM / llama.cpp server started without a key) needs no variable set."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = _bad(llm__judge=ml_collections.ConfigDict(dict(kind="openai", model="m", api_key_env=())))
    assert "online" in job.validate(config, tmp_path / "work")


def test_a_back_end_kind_switch_works_and_every_gemini_knob_is_settable(tmp_path, monkeypatch, caplog):
    """Issue 16: `--config.llm.judge.kind=offline` on a config with Gemini blocks failed once synthesis started
    ("offline back end takes no options"); timeout_s / max_attempts / base_url were not keys of the block."""
    from icml_jax.llm.offline import OfflineBackend
    from icml_jax.llm.registry import make_backend

    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    gc = load_config("gc")
    for key, value in (("timeout_s", 10.0), ("max_attempts", 3), ("base_url", "http://127.0.0.1:1")):
        gc.llm.generator[key] = value  # a locked ConfigDict accepts only existing keys (as the command line)
    config = tiny_demo()
    config.mode = ("synthesize",)
    config.llm.generator, config.llm.judge = gc.llm.generator, gc.llm.judge
    with pytest.raises(job.ConfigError, match="or try it without a key: --config.llm.generator.kind=offline"):
        job.validate(config, tmp_path / "work")
    config.llm.generator.kind = config.llm.judge.kind = "offline"
    job.validate(config, tmp_path / "work")
    assert isinstance(make_backend(config.llm.generator), OfflineBackend)
    assert "kind 'offline' ignores the other back ends' option(s)" in caplog.text and "timeout_s" in caplog.text


def test_synthesizer_block_writes_the_expert_data(tmp_path, monkeypatch):
    """llm.synthesizer, when set, writes the storylines; the generator (here a Gemini block without a key)
    condenses the expert memories as it condenses online ones, so a synthesis-only run needs it unless
    synthesis.condense_memories is off."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_demo()
    config.mode = ("synthesize",)
    config.llm.generator = ml_collections.ConfigDict(dict(kind="gemini", model="gemini-2.5-flash"))
    config.llm.synthesizer = ml_collections.ConfigDict(dict(kind="offline"))
    with pytest.raises(job.ConfigError, match="config.llm.generator is a Gemini back end"):
        job.run(config, tmp_path, out=io.StringIO())
    config.synthesis.condense_memories = False
    job.run(config, tmp_path, out=io.StringIO())
    manifest = json.loads((tmp_path / "synthesis" / "manifest.json").read_text())
    assert manifest["backend"]["name"] == "offline" and manifest["counts"]["storylines_accepted"] > 0


def test_several_processes_are_checked_before_any_stage(tmp_path, monkeypatch):
    """A run of several processes (tests/test_main_multihost.py runs one) is checked before anything is written:
    here the default mesh, whose data axis cannot be split over 2 processes (its other rules are unit-tested
    there)."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(job.ConfigError, match="data=1, which is not a multiple of the 2 JAX processes"):
        job.run(tiny_demo(), tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_api_key_is_checked_but_never_shown(tmp_path, monkeypatch):
    secret = "test-secret-key-123"
    monkeypatch.setenv("GEMINI_API_KEY", secret)
    config = _bad(llm__generator=ml_collections.ConfigDict(dict(kind="gemini", model="gemini-2.5-flash")),
                  parallel__mesh__tensor=jax.device_count() + 1)
    with pytest.raises(job.ConfigError) as err:  # the key check passes; the next check fails
        job.run(config, tmp_path / "work")
    assert "config.parallel.mesh" in str(err.value) and secret not in str(err.value)


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, "-m", "icml_jax.main", f"--config={ROOT / 'configs' / 'demo.py'}",
                           f"--workdir={tmp_path / 'work'}", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_overrides(tmp_path):
    done = _cli("--config.mode=synthesize", "--config.synthesis.num_seeds=2",
                "--config.synthesis.storylines_per_seed=1", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "work" / "synthesis" / "manifest.json").read_text())
    assert manifest["counts"]["seeds"] == 2 and manifest["counts"]["storylines_requested"] == 2
    assert [r["stage"] for r in read_metrics(tmp_path / "work")] == ["synthesize", "summary"]
    assert "icml_jax run finished" in done.stdout

    bad = _cli("--config.model.kind=pretrained", "--config.model.path=/nonexistent/ckpt", tmp_path=tmp_path)
    assert bad.returncode == 2
    assert "config error: config.model.path='/nonexistent/ckpt'" in bad.stderr
    assert "stages:" not in bad.stderr

    # `=None` unsets a key, a number's too (ml_collections read it as the text "None" or refused it)
    unset = _cli("--config.model.kind=pretrained", "--config.model.path=None", "--config.rl.ppo.max_grad_norm=None",
                 tmp_path=tmp_path)
    assert unset.returncode == 2 and unset.stderr.startswith("config error: config.model.path is not set"), unset.stderr

    # a key the config lacks: one line naming the flag (it was a 55-line traceback); --debug shows the traceback
    typo = _cli("--config.learner.update_evry=2", tmp_path=tmp_path)
    assert typo.returncode == 2 and typo.stderr.strip().splitlines() == [typo.stderr.strip()], typo.stderr
    assert typo.stderr.startswith("config error: --config.learner.update_evry: no such key"), typo.stderr
    debug = _cli("--config.learner.update_evry=2", "--debug", tmp_path=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_a_user_error_inside_a_stage_ends_in_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    """A stage failing on something the user controls (here a diverged warm-up) prints one line naming the stage,
    the workdir and the cause, exit status 2; a bug keeps its traceback."""
    from icml_jax.rl.divergence import DivergenceError

    def diverge(run):
        raise DivergenceError("warm-up diverged at step 3: the update's norm 1e+30 is ...")

    monkeypatch.setattr(pipeline, "STAGE_FNS", {**pipeline.STAGE_FNS, "synthesize": diverge})
    monkeypatch.setattr(cli, "CONFIG", type("Flag", (), {"value": tiny_demo()})())
    monkeypatch.setattr(cli, "WORKDIR", type("Flag", (), {"value": str(tmp_path / "work")})())
    monkeypatch.setattr(cli, "DEBUG", type("Flag", (), {"value": False})())
    monkeypatch.setattr(cli, "quiet_info_logs", lambda: None)
    with pytest.raises(SystemExit) as done:
        job.main(["main"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("stages:")]
    assert done.value.code == 2 and len(err) == 1, err  # the progress bar aside
    assert err[0].startswith("run error: stage 'synthesize' failed (workdir ") and "step 3" in err[0]

    monkeypatch.setattr(pipeline, "STAGE_FNS", {**pipeline.STAGE_FNS, "synthesize": lambda run: 1 / 0})
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as bug:  # a bug is not a user error
        job.main(["main"])
    assert cli.user_error(bug.value) is None


def test_dataset_configs_load_with_gemini_back_ends():
    for name, dataset in (("cc", "cc"), ("msc", "msc"), ("gc", "gapchat")):
        config = load_config(name)
        assert config.data.name == dataset and config.llm.judge.kind == "gemini"
        assert config.llm.generator.model == "gemini-2.5-flash" and config.model.path is None
        assert config.policy.planner_model is None
    base = load_config("base")
    assert tuple(base.mode) == ("synthesize", "warmup", "online")
    assert base.warmup.learning_rate == 2e-5 and base.rl.ppo.actor_lr == 1e-6 and base.synthesis.num_seeds == 84
    base.learner.note_max_tokens = 40  # one knob caps the online notes and the expert data's
    assert base.synthesis.note_max_tokens == 40 and RunSpec.from_config(base).learner.agent.note_max_tokens == 40


def test_smollm2_demo_config_uses_the_fetched_model_for_policies_and_replies(tmp_path):
    """configs/demo_smollm2.py: SmolLM2 (the fetch cache) as backbone and as the local reply/note writer, offline
    storylines and oracle judge; with the model fetched it passes the up-front checks."""
    from icml_jax.models.fetch import is_converted, model_dir

    config = load_config("demo_smollm2")
    path = str(model_dir("smollm2-135m-instruct"))
    assert config.model.kind == "pretrained" and config.model.path == config.policy.planner_model == path
    assert config.llm.generator.kind == "local" and config.llm.generator.model_dir == path
    assert config.llm.synthesizer.kind == "offline" and config.llm.judge.kind == "offline"
    if is_converted(path, "smollm2-135m-instruct"):
        assert job.validate(config, tmp_path / "work") == ("synthesize", "warmup", "online")
    # the comparison arms: same episodes, observation and back ends; only the policies' backbone (and writer) swap
    tiny, offline = load_config("demo_smollm2", "tiny"), load_config("demo_smollm2", "tiny_offline")
    demo = load_config("demo")
    for arm in (tiny, offline):
        assert (arm.model.kind, arm.model.hidden, arm.model.layers) == ("tiny", demo.model.hidden, demo.model.layers)
        assert arm.data.to_dict() == config.data.to_dict() and arm.observation == config.observation
        assert arm.synthesis.to_dict() == config.synthesis.to_dict() and arm.llm.judge.kind == "offline"
    assert tiny.llm.generator.to_dict() == config.llm.generator.to_dict() and offline.llm.generator.kind == "offline"
    with pytest.raises(ValueError, match="unknown arm 'big'"):
        load_config("demo_smollm2", "big")


def test_real_backbone_learning_config_arms_differ_only_in_backbone_and_writer(tmp_path):
    """configs/learn_smollm2.py: every arm plays the same 48 + 16 episodes with the same observation, expert
    data and oracle judge; backbone arms train LoRA on the top layers at the config's rates, tiny arms keep the
    demo's heads-only rates; `_writer` arms write with SmolLM2, the others offline."""
    from icml_jax.models.fetch import is_converted, model_dir

    arms = {arm: load_config("learn_smollm2", arm) for arm in ("smollm2", "smollm2_writer", "gemma3", "tiny",
                                                                "tiny_writer")}
    ref, demo = arms["smollm2"], load_config("demo")
    assert (ref.data.train_episodes, ref.data.eval_episodes) == (48, 16)
    smollm2, gemma = str(model_dir("smollm2-135m-instruct")), str(model_dir("gemma3-270m"))
    for name, arm in arms.items():
        assert arm.data.to_dict() == ref.data.to_dict() and arm.observation == ref.observation, name
        assert arm.synthesis.to_dict() == ref.synthesis.to_dict() and arm.llm.judge.kind == "offline", name
        assert arm.llm.generator.kind == ("local" if name.endswith("_writer") else "offline"), name
        if name.endswith("_writer"):
            assert arm.llm.generator.model_dir == smollm2
        if name.startswith("tiny"):
            assert arm.model.kind == "tiny" and arm.rl.ppo.to_dict() == dict(demo.rl.ppo.to_dict(), epochs=2)
        else:
            assert arm.model.path == (gemma if name == "gemma3" else smollm2) and arm.lora.layers == 4
            assert (arm.rl.ppo.actor_lr, arm.rl.ppo.critic_lr, arm.rl.ppo.lora_lr) != (demo.rl.ppo.actor_lr,
                                                                                        demo.rl.ppo.critic_lr, None)
    for name, source in (("smollm2", "smollm2-135m-instruct"), ("gemma3", "gemma3-270m")):
        if is_converted(arms[name].model.path, source):
            assert job.validate(arms[name], tmp_path / name) == ("synthesize", "warmup", "online")
    with pytest.raises(ValueError, match="unknown arm 'big'"):
        load_config("learn_smollm2", "big")


def test_locomo_config_asks_every_system_of_tables_1_and_6_on_the_shared_file():
    """configs/locomo_smollm2.py: gc_smollm2's agent and back ends; the LoCoMo block names the shared file, every
    baseline of Tables 1 and 6, dense at k = 1, 3, 10 and the evidence oracle; notes are the turns themselves."""
    from icml_jax.baselines import BASELINES
    from icml_jax.experiments.locomo import LocomoSettings
    from tests.data.conftest import SHARED_DATA

    config, gapchat = load_config("locomo_smollm2"), load_config("gc_smollm2")
    assert config.llm.to_dict() == gapchat.llm.to_dict() and config.learner.to_dict() == gapchat.learner.to_dict()
    settings = LocomoSettings.from_config(config)
    assert Path(settings.file) == SHARED_DATA / "locomo" / "locomo7.json" and settings.notes == "turn"
    named = {s for s in settings.systems if not s.startswith("dense@")}
    assert named == {"ours", "evidence_oracle", *BASELINES} - {"dense"}
    assert {s for s in settings.systems if s.startswith("dense@")} == {"dense@1", "dense@3", "dense@10"}


def test_gapchat_real_model_config_runs_local_models_only(tmp_path):
    """configs/gc_smollm2.py: GapChat's 60 test episodes (the shared sample), SmolLM2 policies, generator and
    score-token judge, MiniLM for BERTScore and the baselines' embeddings; the final sessions never train; with
    the models fetched and the sample built it passes the up-front checks."""
    from icml_jax.data import tfds_builders as tb
    from icml_jax.models.fetch import is_converted, model_dir
    from tests.data.conftest import SHARED_DATA

    config = load_config("gc_smollm2")
    smollm2, minilm = str(model_dir("smollm2-135m-instruct")), str(model_dir("all-minilm-l6-v2"))
    assert (config.data.name, config.data.tfds_name, config.data.split) == ("gapchat", "gapchat_episodes/sample",
                                                                            "test_4+test_5")
    assert not config.data.train_final_sessions and config.model.path == smollm2
    for role in ("generator", "judge"):
        assert config.llm[role].kind == "local" and config.llm[role].model_dir == smollm2, role
    assert config.llm.judge.judge_mode == "scores" and config.llm.synthesizer.kind == "offline"
    assert (config.eval.bertscore_model, config.eval.bertscore_layer, config.eval.mauve_model) == (minilm, 6, smollm2)
    assert config.baselines.encoder_model == minilm
    assert config.eval.reply_temperature == 0.0 and config.eval.memory_gain  # greedy replies, memory gain scored
    # the setting measured on 3 seeds: an update after each of the 8 episodes, the saved turns' text as notes, and
    # every update's checkpoint kept for the held-out curve
    assert config.data.train_episodes == 8
    assert (config.learner.notes, config.learner.update_every, config.learner.users_in_flight) == ("turn", 1, 1)
    assert (config.checkpoint.every_episodes, config.checkpoint.keep) == (1, config.data.train_episodes)
    if is_converted(smollm2, "smollm2-135m-instruct") and (SHARED_DATA / "gapchat").is_dir():
        tb.build(config.data.tfds_name, manual_dir=SHARED_DATA / "gapchat", data_dir=tmp_path / "tfds")
        config.data.data_dir = str(tmp_path / "tfds")
        assert job.validate(config, tmp_path / "work") == ("synthesize", "warmup", "online")
        # the evaluation draws from the same built sample (not gapchat_episodes/protocol, which needs the release)
        from icml_jax.evaluate import eval_episodes

        assert config.eval.tfds_name == "gapchat_episodes/sample"
        chosen = eval_episodes(config)
        assert len(chosen) == config.eval.episodes and all(e.episode_id.startswith("gapchat-test-") for e in chosen)
        # the online stream's cut applies to the evaluated episodes too: every session at most 8 turns
        assert config.data.max_session_turns == 8
        assert max(len(s.turns) for e in chosen for s in e.sessions) == 8


def test_pretrained_checkpoint_passes_checks_and_builds(tmp_path):
    from icml_jax.agents import tiny
    from tests.models import hf_fixtures as F

    F.build("qwen3", tmp_path / "ckpt")
    tiny.build_tokenizer(tmp_path / "ckpt", ["hello", "world"])
    config = tiny_demo()
    config.model.kind, config.model.path, config.model.dtype = "pretrained", str(tmp_path / "ckpt"), "float32"
    assert job.validate(config, tmp_path / "work") == ("synthesize", "warmup", "online")
    assert config.policy.planner_model == str(tmp_path / "ckpt")
    policies, tokenizer = build_models(config, tmp_path / "work")
    assert policies.shared_backbone and tokenizer("hello world")["input_ids"][-2:] == [4, 5]


def test_gc_config_learns_online_on_built_gapchat_data(tmp_path):
    """configs/gc.py end to end on the in-repo GapChat fixtures: a local checkpoint, offline back ends, both
    speakers acted on, per-session rows, resumable checkpoints."""
    from icml_jax.data import tfds_builders as tb
    from icml_jax.agents import tiny
    from tests.models import hf_fixtures as F

    F.build("qwen3", tmp_path / "ckpt")
    tiny.build_tokenizer(tmp_path / "ckpt", ["hello", "world", "i", "like", "my", "dog"])
    config = load_config("gc")
    tb.build(config.data.tfds_name, manual_dir=ROOT / "tests" / "data" / "fixtures" / "gapchat",
             data_dir=tmp_path / "tfds")
    config.mode = ("online",)
    config.model.path, config.model.dtype = str(tmp_path / "ckpt"), "float32"
    config.data.data_dir, config.data.train_episodes = str(tmp_path / "tfds"), 3
    config.llm.generator = ml_collections.ConfigDict(dict(kind="offline"))
    config.llm.judge = ml_collections.ConfigDict(dict(kind="offline"))
    config.learner.reply_max_tokens = 16
    config.checkpoint.every_episodes = 2
    config.observation.max_length = config.observation.min_length_bucket = 32  # one shape: one PPO program
    config.observation.max_candidates = 1
    compiled: list[str] = []
    listener = lambda event, secs, fun_name="", **kw: (  # noqa: E731
        compiled.append(fun_name) if event == "/jax/core/compile/backend_compile_duration" else None)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        summary = job.run(config, tmp_path / "work", out=io.StringIO())
    finally:
        jax._src.monitoring.unregister_event_duration_listener(listener)
    # heads, optimizer counters and placeholders live on the model's mesh: 3 updates, each PPO program (one step,
    # a run of 8 steps) compiled at most once
    steps = [compiled.count(name) for name in ("jit(ppo_step)", "jit(ppo_steps)")]
    assert max(steps) == 1 and sum(steps) >= 1, sorted(set(compiled))
    assert summary["online"]["episodes"] == 3 and summary["online"]["updates"] == 3
    rows = read_metrics(tmp_path / "work")
    episodes = [r for r in rows if r["stage"] == "online" and "episode" in r]
    assert [r["episode"] for r in episodes] == [1, 2, 3]
    assert all(r["update/decisions/trigger"] >= r["episode/turns"] > 0 for r in episodes)
    online = [r for r in rows if r.get("table") == "sessions"]
    assert online and {r["phase"] for r in online} == {"online"} and all(r["reward_trigger"] is not None
                                                                          for r in online)
    assert not [r for r in rows if r["stage"] == "eval"]  # real data has no labels to evaluate against
    assert sorted(int(p.name) for p in (tmp_path / "work" / layout.CHECKPOINT_DIR).iterdir()) == [0, 2, 3]

    # the evaluation protocol on the same fixtures: the pooled 4- and 5-session test files (4 episodes here)
    from icml_jax import evaluate as ev
    from icml_jax.data.protocol import load_eval_episodes

    from icml_jax.evaluation.report import TABLE1, TABLE8
    from tests.evaluation.test_model_metrics import write_tiny_bert

    config.eval.episodes = 4
    config.eval.bertscore_model, config.eval.bertscore_layer = str(write_tiny_bert(tmp_path / "bert")), 2
    config.eval.mauve_model = str(tmp_path / "ckpt")  # the backbone's own checkpoint as MAUVE's featurizer
    content = ev.evaluate_workdir(config, tmp_path / "work")
    episodes = load_eval_episodes("gapchat", data_dir=tmp_path / "tfds", n=4)
    assert content["episodes"] == 4 and content["targets"] == sum(len(e.sessions[-1].turns) - 1 for e in episodes)
    assert content["generation"]["judge"]["failures"] == 0 and content["generation"]["BLEU-4"] >= 0
    assert all(content["generation"][c] is not None for c in TABLE1)  # every Table 1 column
    assert all(c in content["memory"] for c in TABLE8) and content["memory"]["proxy_truth"]["saves"] >= 0
    assert content["memory"]["trigger_recall"] is None  # GapChat has no y_t labels: not measurable, not 0
    assert (tmp_path / "work" / ev.EVAL_DIR / "results.md").is_file()
    assert content["setting"]["reply_temperature"] == 0.7  # the learner's: eval.reply_temperature is None
    assert content["setting"]["memory_gain"] == {
        "computed": False, "reason": "the offline generator cannot score a given continuation (only the local back "
                                     "end can)"}
    notes = content["setting"]["notes"]  # the note check's counts: the offline writer's notes are the turns
    assert set(notes) == {"notes", "rewritten", "fallback", "problems"} and notes["rewritten"] == notes["fallback"] == 0
    planner = content["setting"]["planner"]  # the Planner's p(save) over the history turns it acted on
    assert planner["decisions"] > 0 and sum(planner["histogram"]) == planner["decisions"]
    assert np.isclose(planner["saved"] / planner["decisions"], content["memory"]["save_rate"])

    # no train/test leak: every played episode went without its final session, and results.json says which
    # episodes trained the evaluated policy
    full = {e.episode_id: len(e.sessions) for e in episodes}
    assert all(r["episode/sessions"] == full[r["episode/id"]] - 1 for r in episodes_rows(rows))
    training = content["setting"]["training"]
    assert training["verified"] and training["online_episodes"] == 3
    assert training["episodes"] == {r["episode/id"]: r["episode/sessions"] for r in episodes_rows(rows)}
    # the old protocol (final sessions played online) trains on what the evaluation scores: refused up front
    from icml_jax.evaluation.leakage import TrainTestLeak

    config.data.train_final_sessions = True
    job.run(config, tmp_path / "leaky", out=io.StringIO())
    leaky = [r for r in episodes_rows(read_metrics(tmp_path / "leaky"))]
    assert all(r["episode/sessions"] == full[r["episode/id"]] for r in leaky)
    with pytest.raises(TrainTestLeak, match=f"trained on the final session of {len({r['episode/id'] for r in leaky})} "
                                            "of the 4 evaluated episodes"):
        ev.evaluate_workdir(config, tmp_path / "leaky")


def episodes_rows(rows: list[dict]) -> list[dict]:
    """The online stage's per-episode rows of a run's metrics."""
    return [r for r in rows if r["stage"] == "online" and "episode/turns" in r]


def test_crashes_in_the_evaluations_resume_to_the_same_run(tmp_path, monkeypatch):
    """A crash in the held-out evaluation before learning, then in the one after it (past the final checkpoint):
    each restart picks up where it should and the metrics end as an uninterrupted run's."""
    from icml_jax.rl import heldout

    def strip(rows):
        return [{k: v for k, v in r.items() if not any(t in k for t in ("time", "seconds", "wall"))} for r in rows]

    job.run(tiny_demo(), tmp_path / "reference", out=io.StringIO())
    reference = strip(read_metrics(tmp_path / "reference"))
    real = heldout.evaluate
    for crash_at in (1, 2):  # the evaluate call that fails: 1 = before learning, 2 = after it
        calls = []

        def flaky(*args, crash_at=crash_at, calls=calls, **kw):
            calls.append(1)
            if len(calls) == crash_at:
                raise RuntimeError("simulated crash")
            return real(*args, **kw)

        monkeypatch.setattr(heldout, "evaluate", flaky)
        with pytest.raises(RuntimeError, match="simulated crash"):
            job.run(tiny_demo(), tmp_path / "crashed", out=io.StringIO())
    monkeypatch.setattr(heldout, "evaluate", real)
    progress = json.loads((tmp_path / "crashed" / layout.PROGRESS_FILE).read_text())
    assert set(progress["done"]) == {"synthesize", "warmup"} and not progress["finished"]
    out = io.StringIO()
    job.run(tiny_demo(), tmp_path / "crashed", out=out)
    assert "resuming" in out.getvalue()
    got = [{k: (v.replace(str(tmp_path / "crashed"), "W") if isinstance(v, str) else v) for k, v in r.items()}
           for r in strip(read_metrics(tmp_path / "crashed"))]
    want = [{k: (v.replace(str(tmp_path / "reference"), "W") if isinstance(v, str) else v) for k, v in r.items()}
            for r in reference]
    assert got == want


def test_users_in_flight_give_the_run_of_one_user_at_a_time(tmp_path):
    """The online stage with 2 users in flight (update and checkpoint every 2 episodes) logs the same episodes,
    rewards, updates and held-out evaluations as playing them one by one (float rounding of the batched forward
    passes aside)."""
    def online_run(users: int, workdir: Path) -> list[dict]:
        config = tiny_demo()
        config.mode = ("online",)  # the untrained policies: no synthesis or warm-up needed to compare
        config.learner.update_every = config.checkpoint.every_episodes = 2
        config.learner.users_in_flight = users
        job.run(config, workdir, out=io.StringIO())
        return [r for r in read_metrics(workdir) if r["stage"] in ("online", "eval")]

    one, two = online_run(1, tmp_path / "one"), online_run(2, tmp_path / "two")
    played = [r.get("episode") for r in two if "table" not in r and not r.get("final")]
    assert played == [None, 1, 2, 3, 4, None]  # eval, 4 episodes (updates after 2 and 4), eval
    assert [sorted(r) for r in two] == [sorted(r) for r in one]  # per-session rows and the final one too
    for a, b in zip(two, one, strict=True):
        for k, v in b.items():
            if isinstance(v, float) and not any(t in k for t in ("time", "seconds", "wall")):
                assert a[k] == pytest.approx(v, rel=1e-4, abs=1e-5, nan_ok=True), k
    assert sorted(p.name for p in (tmp_path / "two" / layout.CHECKPOINT_DIR).iterdir()) == ["0", "2", "4"]
