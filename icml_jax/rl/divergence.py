"""Divergence detection for the warm-up and PPO loops: host-side checks on each optimizer step's figures.

The jitted steps already drop a step whose loss, gradient or new parameters are non-finite (`optim.guarded_apply`)
and report the parameter norm and the norm of the proposed update. That guard alone lets a run diverge
quietly: a step that sends the parameters to 1e30 is finite, and every later step is then skipped. The monitor
here reads each step's figures and says "diverged" on any of

* an update larger than `max_update_ratio` times the parameter norm before it (an Adam step at a sane learning
  rate moves LoRA parameters by well under 1% per step; at lr 1e3 by orders of magnitude more than 100%);
* `max_consecutive_skips` non-finite steps in a row;
* a loss above `loss_spike` times the mean |loss| of the previous `window` steps (off by default: PPO's loss
  changes sign and sits near 0, so a ratio to its recent mean is noise there; useful for the warm-up).

The caller decides what a divergence does (`action`): "stop" raises `DivergenceError` naming the stage, the step
and the figures; "rollback" restores the last good state and goes on, at most `max_rollbacks` times per stage.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.configlib import known_fields

ACTIONS = ("stop", "rollback")
logger = logging.getLogger(__name__)


class DivergenceError(RuntimeError):
    """Training diverged; the message names the stage, the step, the figures and the setting that tripped."""


@dataclasses.dataclass(frozen=True)
class DivergenceConfig:
    """When a stage counts as diverged and what happens then (config block `divergence`)."""

    max_update_ratio: float = 1.0  # ||update|| / ||params|| of one step above this: diverged (0: off)
    max_consecutive_skips: int = 3  # this many non-finite (skipped) steps in a row: diverged (0: off)
    loss_spike: float = 0.0  # loss > loss_spike * mean |loss| of the previous `window` steps: diverged (0: off)
    window: int = 20  # steps in the loss-spike baseline (the check starts once the window is full)
    action: str = "stop"  # "stop": fail the stage with a DivergenceError; "rollback": restore the last good state
    max_rollbacks: int = 3  # rollbacks allowed per stage before it stops anyway

    def __post_init__(self) -> None:
        for name in ("max_update_ratio", "loss_spike"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"DivergenceConfig.{name} must be a finite number >= 0 (0: off), got {value!r}")
        for name, low in (("max_consecutive_skips", 0), ("window", 1), ("max_rollbacks", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"DivergenceConfig.{name} must be an int >= {low}, got {value!r}")
        if self.action not in ACTIONS:
            raise ValueError(f"DivergenceConfig.action must be one of {ACTIONS}, got {self.action!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a config block)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, cfg: Any) -> DivergenceConfig:
        """From a config block (ConfigDict, mapping or None: the defaults); unknown keys are an error."""
        return cls(**known_fields(cls, cfg))


@dataclasses.dataclass(frozen=True)
class StepFigures:
    """What one optimizer step reports to the monitor (host floats)."""

    step: int  # 1-based step number within the stage
    loss: float
    skipped: bool
    param_norm: float  # of the trainable parameters before the step
    update_norm: float  # of the proposed change (new - old), applied or not


class DivergenceMonitor:
    """Feeds on each step's figures; `observe` returns why the step diverged, or None. State is checkpointable."""

    def __init__(self, config: DivergenceConfig, stage: str) -> None:
        self.config, self.stage = config, stage
        self.consecutive_skips = 0
        self.skipped = 0
        self.rollbacks = 0
        self._losses: collections.deque[float] = collections.deque(maxlen=config.window)

    def observe(self, f: StepFigures) -> str | None:
        """Records step `f`; returns a one-line reason when it diverged (the step is then not part of the baseline)."""
        cfg = self.config
        if f.skipped:
            self.skipped += 1
            self.consecutive_skips += 1
            if cfg.max_consecutive_skips and self.consecutive_skips >= cfg.max_consecutive_skips:
                return (f"{self.consecutive_skips} steps in a row had a non-finite loss, gradient or parameters and "
                        f"were skipped (divergence.max_consecutive_skips={cfg.max_consecutive_skips})")
            return None
        self.consecutive_skips = 0
        if cfg.max_update_ratio and f.param_norm > 0 and f.update_norm > cfg.max_update_ratio * f.param_norm:
            return (f"the update's norm {f.update_norm:.3g} is {f.update_norm / f.param_norm:.3g} x the parameter "
                    f"norm {f.param_norm:.3g} (divergence.max_update_ratio={cfg.max_update_ratio:g})")
        if cfg.loss_spike and len(self._losses) == cfg.window:
            base = sum(abs(x) for x in self._losses) / len(self._losses)
            if base > 0 and f.loss > cfg.loss_spike * base:
                return (f"loss {f.loss:.4g} is {f.loss / base:.3g} x the mean |loss| {base:.4g} of the previous "
                        f"{cfg.window} steps (divergence.loss_spike={cfg.loss_spike:g})")
        self._losses.append(f.loss)
        return None

    def diverged(self, f: StepFigures, reason: str, hint: str) -> None:
        """Acts on a divergence at step `f`: raises DivergenceError unless a rollback is allowed (then counts it)."""
        cfg = self.config
        if cfg.action == "rollback" and self.rollbacks < cfg.max_rollbacks:
            self.rollbacks += 1
            self.consecutive_skips = 0
            return
        extra = (f"; {self.rollbacks} rollback(s) already (divergence.max_rollbacks={cfg.max_rollbacks})"
                 if cfg.action == "rollback" else "")
        raise DivergenceError(f"{self.stage} diverged at step {f.step}: {reason}; loss {f.loss:.4g}, parameter "
                              f"norm {f.param_norm:.3g}{extra}. {hint}")

    def state_dict(self) -> dict[str, Any]:
        """JSON-able running state (resume continues the same checks)."""
        return {"consecutive_skips": self.consecutive_skips, "skipped": self.skipped, "rollbacks": self.rollbacks,
                "losses": list(self._losses)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict` output."""
        self.consecutive_skips = int(state["consecutive_skips"])
        self.skipped = int(state["skipped"])
        self.rollbacks = int(state["rollbacks"])
        self._losses.clear()
        self._losses.extend(float(x) for x in state["losses"])


def check_window(monitor: DivergenceMonitor, steps: Sequence[tuple[str | None, Mapping[str, Any]]], first_step: int,
                 hint: str, rolled_back_to: str) -> bool:
    """Feeds a window of steps (agent or None, host metrics with loss / skipped / param_norm / update_norm) to the
    monitor, warning of skipped steps as they are read; True when the window diverged and is to be rolled back
    (with action 'stop' a DivergenceError is raised). The one check of the warm-up's and the PPO update's loops;
    `rolled_back_to` says in the warning what a rollback restores."""
    for k, (agent, m) in enumerate(steps):
        f = StepFigures(first_step + k + 1, float(m["loss"]), bool(m["skipped"]), float(m["param_norm"]),
                        float(m["update_norm"]))
        tag = f" ({agent})" if agent else ""
        if f.skipped:
            logger.warning("%s: step %d%s skipped: non-finite loss, gradient or parameters (%d skipped so far)",
                           monitor.stage, f.step, tag, monitor.skipped + 1)
        reason = monitor.observe(f)
        if reason is not None:
            monitor.diverged(f, f"{reason} ({agent} step)" if agent else reason, hint)
            logger.warning("%s diverged at step %d: %s; rolled back to %s (rollback %d of at most %d)", monitor.stage,
                           f.step, reason, rolled_back_to, monitor.rollbacks, monitor.config.max_rollbacks)
            return True
    return False
