"""Synthesis progress bar: its total is every first-try request the storylines need, and it ends full even when
storylines are dropped."""

from __future__ import annotations

import json

from tqdm.auto import tqdm

from icml_jax.llm import OfflineBackend
from icml_jax.synthesis import SynthesisConfig, prompts, storylines, synthesize
from tests.data.test_synthesis import WORLD, FaultyBackend


def test_synthesis_shows_a_bar_with_its_total(tmp_path, capsys):
    config = SynthesisConfig(seed=3, num_seeds=2, storylines_per_seed=1, prequels_per_storyline=1, world=WORLD,
                             heldout_fraction=0.0)
    manifest = synthesize(config, OfflineBackend(), tmp_path)
    err = capsys.readouterr().err
    assert manifest["requests"]["requests"] == 2 + 2 * 3  # seed sessions + (1 prequel + 2 annotations) each
    assert "synthesis storylines" in err and "0/8" in err


def test_the_bar_ends_full_when_storylines_are_dropped(tmp_path, monkeypatch):
    closed = []

    class Recorder(tqdm):
        def close(self):
            if not self.disable:
                closed.append((self.desc, self.n, self.total))
            super().close()

    def fault(r):
        md = r.metadata
        if md["seed_id"] == "seed-5-1" and r.task == prompts.TASK_SYNTH_SEED:
            return "no JSON"  # the seed and both its storylines dropped
        if md["seed_id"] == "seed-5-0" and md["storyline"] == 0 and r.task == prompts.TASK_SYNTH_PREQUEL:
            return "no JSON"  # dropped at its first prequel
        if md["seed_id"] == "seed-5-2" and md["storyline"] == 1 and r.task == prompts.TASK_SYNTH_ANNOTATE \
                and md["session"] == 1:
            return json.dumps({"labels": [{"turn": 0, "gain": 0.0, "needs": [{"session": 2, "turn": 0}]}]})
        return None

    monkeypatch.setattr(storylines, "tqdm", Recorder)
    config = SynthesisConfig(seed=5, num_seeds=3, storylines_per_seed=2, prequels_per_storyline=2, world=WORLD,
                             heldout_fraction=0.0)
    manifest = synthesize(config, FaultyBackend(fault), tmp_path)
    assert {(r["seed_id"], r["stage"]) for r in manifest["rejections"]} == {
        ("seed-5-1", "seed"), ("seed-5-0", "prequel_0"), ("seed-5-2", "annotate_1")}
    assert closed == [("synthesis storylines", 3 + 3 * 2 * 5, 3 + 3 * 2 * 5)]
