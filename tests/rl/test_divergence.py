"""The divergence monitor's checks (pure): update/parameter norm ratio, consecutive skipped steps, loss spikes,
rollback budget, checkpointable state, config validation."""

from __future__ import annotations

import pytest

from icml_jax.rl.divergence import DivergenceConfig, DivergenceError, DivergenceMonitor, StepFigures


def fig(step: int, loss: float = 1.0, skipped: bool = False, param_norm: float = 10.0, update_norm: float = 0.01):
    return StepFigures(step, loss, skipped, param_norm, update_norm)


def test_an_update_larger_than_the_parameters_diverges_and_stop_names_the_step():
    mon = DivergenceMonitor(DivergenceConfig(max_update_ratio=1.0), "warm-up")
    assert mon.observe(fig(1)) is None
    f = fig(2, update_norm=3e30)
    reason = mon.observe(f)
    assert reason and "3e+30" in reason and "max_update_ratio=1" in reason
    with pytest.raises(DivergenceError, match=r"warm-up diverged at step 2: the update's norm 3e\+30 .*lower"):
        mon.diverged(f, reason, "lower the learning rate")
    assert DivergenceMonitor(DivergenceConfig(max_update_ratio=0.0), "x").observe(f) is None  # 0: off
    assert mon.observe(fig(3, param_norm=0.0, update_norm=1.0)) is None  # zero-initialised parameters: no ratio


def test_consecutive_skips_diverge_but_isolated_ones_do_not():
    mon = DivergenceMonitor(DivergenceConfig(max_consecutive_skips=3), "online PPO update")
    for step in range(1, 20):  # every other step skipped: never 3 in a row
        assert mon.observe(fig(step, skipped=step % 2 == 0)) is None
    assert mon.skipped == 9
    assert mon.observe(fig(20, skipped=True)) is None and mon.observe(fig(21, skipped=True)) is None
    assert "3 steps in a row" in mon.observe(fig(22, skipped=True))


def test_a_loss_spike_over_the_recent_mean_diverges_once_the_window_is_full():
    mon = DivergenceMonitor(DivergenceConfig(loss_spike=10.0, window=4), "warm-up")
    assert mon.observe(fig(1, loss=100.0)) is None  # window not full: no baseline yet
    for step, loss in enumerate((1.0, 1.0, 1.0), start=2):
        assert mon.observe(fig(step, loss=loss)) is None
    assert mon.observe(fig(5, loss=5.0)) is None  # 5 < 10 x mean(100, 1, 1, 1)
    assert "loss 300 is" in mon.observe(fig(6, loss=300.0))  # 300 > 10 x mean(1, 1, 1, 5) = 20
    assert DivergenceMonitor(DivergenceConfig(), "x").config.loss_spike == 0.0  # off by default (PPO's sign)


def test_rollback_is_allowed_max_rollbacks_times_then_stops():
    mon = DivergenceMonitor(DivergenceConfig(action="rollback", max_rollbacks=2), "warm-up")
    f = fig(7, update_norm=1e9)
    for _ in range(2):
        mon.diverged(f, mon.observe(f), "hint")  # no raise: the caller rolls back
    assert mon.rollbacks == 2
    with pytest.raises(DivergenceError, match=r"2 rollback\(s\) already \(divergence.max_rollbacks=2\)"):
        mon.diverged(f, mon.observe(f), "hint")


def test_state_round_trips_so_a_resumed_run_checks_alike():
    cfg = DivergenceConfig(loss_spike=2.0, window=3, max_consecutive_skips=2)
    a = DivergenceMonitor(cfg, "x")
    for step, (loss, skipped) in enumerate([(1.0, False), (2.0, False), (0.0, True)], start=1):
        a.observe(fig(step, loss=loss, skipped=skipped))
    b = DivergenceMonitor(cfg, "x")
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    nxt = fig(4, skipped=True)
    assert a.observe(nxt) == b.observe(nxt) is not None  # both see the second skip in a row


@pytest.mark.parametrize("bad", [dict(max_update_ratio=-1.0), dict(max_update_ratio=float("nan")),
                                 dict(loss_spike=-2.0), dict(window=0), dict(max_consecutive_skips=-1),
                                 dict(action="ignore"), dict(max_rollbacks=1.5)])
def test_bad_settings_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=f"DivergenceConfig.{next(iter(bad))}"):
        DivergenceConfig(**bad)
    with pytest.raises(ValueError, match="unknown key"):
        DivergenceConfig.from_config({"max_update_rato": 1.0})
