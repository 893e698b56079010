"""The Pending Reward Buffer: saves wait here until the Trigger retrieves them, then earn the truth reward.

Life of an entry (keyed by the fragment id the save created):
  `add` (status "pending") -> `on_trigger` by the same user at a later turn or session (status "triggered")
  -> `finalize` emits a `SaveReward` for its save decision and drops the entry.
Untriggered entries at `finalize` follow `RewardConfig.untriggered` ("proxy": finalized with the proxy reward;
"defer": kept until triggered, until their user is closed, or `force=True`). A trigger of a fragment that is
not pending (never added, or already finalized) is counted as "untracked" and ignored: a reward that already
went into an update is never changed. Triggers across users follow `RewardConfig.user_mismatch`.
The whole buffer round-trips through `state_dict()` / `from_state_dict()` as plain JSON data; the config is
not stored (pass it again on restore). "Later turn" is not checked here: a fragment only enters memory after
its save, so the Trigger cannot select it earlier; `turn_ref`s are kept opaquely for provenance and metrics.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from icml_jax.rl.config import RewardConfig
from icml_jax.rl.rewards import truth_reward

STATE_FORMAT = "icml_jax.rl.PendingRewardBuffer"
STATE_VERSION = 1

ASSIGNED = "assigned"  # the trigger counts towards the fragment's r_qual(future)
REPEAT = "repeat"  # a later trigger of an already-triggered fragment under multi_trigger="first": counted only
UNTRACKED = "untracked"  # the fragment is not pending (never added here, or already finalized)
USER_MISMATCH = "user_mismatch"  # another user's fragment (only returned under user_mismatch="count")

_STAT_KEYS: tuple[str, ...] = (
    "added",
    "triggers_assigned",
    "triggers_repeat",
    "triggers_untracked",
    "triggers_user_mismatch",
    "finalized_triggered",
    "finalized_untriggered",
)


class UserMismatchError(ValueError):
    """A user triggered a fragment owned by another user: per-user memory isolation is broken upstream."""


@dataclasses.dataclass(frozen=True)
class SaveReward:
    """The final reward of one save decision, emitted once by `finalize` and joined to its rollout receipt."""

    decision_id: str
    fragment_id: str
    user_id: str
    r_proxy: float
    reward: float
    triggered: bool
    r_qual_future: float | None  # the aggregated r_qual(future) used, None when never triggered
    num_triggers: int
    created_ref: Any = None  # the saved turn's reference as given to `add` (the learner: [episode, session, turn])


@dataclasses.dataclass
class _Entry:
    """One pending save: who owns it, which decision made it, its proxy reward and the triggers so far."""

    fragment_id: str
    user_id: str
    decision_id: str
    r_proxy: float
    created_ref: Any = None
    triggers: list[tuple[float, Any]] = dataclasses.field(default_factory=list)  # (r_qual, turn_ref)

    @property
    def status(self) -> str:
        """'triggered' once any trigger was assigned, else 'pending'."""
        return "triggered" if self.triggers else "pending"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict of the entry."""
        return {
            "fragment_id": self.fragment_id,
            "user_id": self.user_id,
            "decision_id": self.decision_id,
            "r_proxy": self.r_proxy,
            "created_ref": self.created_ref,
            "status": self.status,
            "triggers": [[q, ref] for q, ref in self.triggers],
        }


def _json_value(value: Any, what: str) -> Any:
    """Normalise a reference (tuple -> list) to plain JSON data, raising naming `what` if it is not JSON-able."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"PendingRewardBuffer: {what} must be JSON-serialisable, got {value!r} ({err})") from err


def _score(value: Any, what: str) -> float:
    """A finite float judge score, or ValueError naming it (a NaN reward must not enter training)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"PendingRewardBuffer: {what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"PendingRewardBuffer: {what} must be finite, got {value!r}")
    return value


def _nonempty_str(value: Any, what: str) -> str:
    """A non-empty string id, or ValueError naming it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"PendingRewardBuffer: {what} must be a non-empty string, got {value!r}")
    return value


class PendingRewardBuffer:
    """Saves waiting for the cross-session truth reward r_truth = r_proxy + lambda * r_qual(future)."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        """Start empty; `config` decides multi-trigger, untriggered and user-mismatch handling."""
        self.config = config if config is not None else RewardConfig()
        self._entries: dict[str, _Entry] = {}  # fragment_id -> entry, in insertion order
        self._decisions: dict[str, str] = {}  # decision_id -> fragment_id, to reject duplicate decisions
        self._stats: dict[str, int] = {k: 0 for k in _STAT_KEYS}

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Number of saves still waiting (pending or triggered, not yet finalized)."""
        return len(self._entries)

    def __contains__(self, fragment_id: object) -> bool:
        """Whether this fragment's save is still waiting in the buffer."""
        return fragment_id in self._entries

    @property
    def stats(self) -> dict[str, int]:
        """Counters of adds, trigger outcomes and finalizations since creation (restored by from_state_dict)."""
        return dict(self._stats)

    def status(self, fragment_id: str) -> str | None:
        """'pending', 'triggered', or None when the fragment is not in the buffer."""
        entry = self._entries.get(fragment_id)
        return None if entry is None else entry.status

    def waiting_decisions(self, user_id: str | None = None) -> list[str]:
        """Decision ids still waiting (optionally of one user): the learner leaves these out of an update."""
        return [e.decision_id for e in self._entries.values() if user_id is None or e.user_id == user_id]

    # ------------------------------------------------------------------ updates
    def add(
        self, *, fragment_id: str, user_id: str, decision_id: str, r_proxy: float, created_ref: Any = None
    ) -> None:
        """Register the save `decision_id` of `user_id` that created `fragment_id`, with its proxy reward."""
        fragment_id = _nonempty_str(fragment_id, "fragment_id")
        user_id = _nonempty_str(user_id, "user_id")
        decision_id = _nonempty_str(decision_id, "decision_id")
        r_proxy = _score(r_proxy, f"r_proxy of fragment {fragment_id!r}")
        created_ref = _json_value(created_ref, f"created_ref of fragment {fragment_id!r}")
        if fragment_id in self._entries:
            raise ValueError(f"PendingRewardBuffer: fragment {fragment_id!r} is already pending")
        if decision_id in self._decisions:
            raise ValueError(
                f"PendingRewardBuffer: decision {decision_id!r} already created pending fragment "
                f"{self._decisions[decision_id]!r}"
            )
        self._entries[fragment_id] = _Entry(fragment_id, user_id, decision_id, r_proxy, created_ref)
        self._decisions[decision_id] = fragment_id
        self._stats["added"] += 1

    def on_trigger(self, user_id: str, fragment_id: str, r_qual: float, turn_ref: Any = None) -> str:
        """Record that `user_id`'s Trigger selected `fragment_id` and the reply scored `r_qual`; returns the outcome.

        Outcomes: ASSIGNED, REPEAT (multi_trigger="first" and already triggered), UNTRACKED (not pending),
        USER_MISMATCH (only under user_mismatch="count"; under "raise" a `UserMismatchError` is raised instead).
        Nothing changes on a mismatch, whatever the policy.
        """
        user_id = _nonempty_str(user_id, "user_id")
        fragment_id = _nonempty_str(fragment_id, "fragment_id")
        r_qual = _score(r_qual, f"r_qual of the trigger of fragment {fragment_id!r}")
        turn_ref = _json_value(turn_ref, f"turn_ref of the trigger of fragment {fragment_id!r}")
        entry = self._entries.get(fragment_id)
        if entry is None:
            self._stats["triggers_untracked"] += 1
            return UNTRACKED
        if entry.user_id != user_id:
            if self.config.user_mismatch == "raise":
                raise UserMismatchError(
                    f"PendingRewardBuffer: user {user_id!r} triggered fragment {fragment_id!r} owned by user "
                    f"{entry.user_id!r} (turn_ref={turn_ref!r}); memories must never cross users"
                )
            self._stats["triggers_user_mismatch"] += 1
            return USER_MISMATCH
        if entry.triggers and self.config.multi_trigger == "first":
            self._stats["triggers_repeat"] += 1
            return REPEAT
        entry.triggers.append((r_qual, turn_ref))
        self._stats["triggers_assigned"] += 1
        return ASSIGNED

    def finalize(self, closed_users: Iterable[str] = (), *, force: bool = False) -> list[SaveReward]:
        """Emit the final rewards due before an update and drop those entries (each decision is emitted once).

        Triggered entries are always emitted. Untriggered ones are emitted with their proxy reward under
        untriggered="proxy"; under "defer" only when their user is in `closed_users` or `force` is set.
        """
        closed = set(closed_users)
        due = [
            e
            for e in self._entries.values()
            if e.triggers or self.config.untriggered == "proxy" or force or e.user_id in closed
        ]
        if not due:
            return []
        qual = np.array([self._aggregate(e) if e.triggers else np.nan for e in due], dtype=np.float32)
        triggered = np.array([bool(e.triggers) for e in due])
        r_proxy = np.array([e.r_proxy for e in due], dtype=np.float32)
        rewards = np.asarray(truth_reward(r_proxy, qual, triggered, self.config))
        out = []
        for entry, q, reward in zip(due, qual, rewards):
            out.append(
                SaveReward(
                    decision_id=entry.decision_id,
                    fragment_id=entry.fragment_id,
                    user_id=entry.user_id,
                    r_proxy=entry.r_proxy,
                    reward=float(reward),
                    triggered=bool(entry.triggers),
                    r_qual_future=float(q) if entry.triggers else None,
                    num_triggers=len(entry.triggers),
                    created_ref=entry.created_ref,
                )
            )
            del self._entries[entry.fragment_id]
            del self._decisions[entry.decision_id]
            self._stats["finalized_triggered" if entry.triggers else "finalized_untriggered"] += 1
        return out

    def _aggregate(self, entry: _Entry) -> float:
        """Combine an entry's trigger qualities per `multi_trigger` ('first' keeps only one anyway)."""
        values = [q for q, _ in entry.triggers]
        if self.config.multi_trigger == "max":
            return max(values)
        if self.config.multi_trigger == "mean":
            return float(np.mean(values))
        return values[0]

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable state: every waiting entry with its triggers, plus the counters."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "entries": [e.to_json() for e in self._entries.values()],
            "stats": dict(self._stats),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], config: RewardConfig | None = None) -> PendingRewardBuffer:
        """Rebuild a buffer from `state_dict()` output, raising with the entry index and field on bad data."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"PendingRewardBuffer.from_state_dict: not a {STATE_FORMAT} state")
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"PendingRewardBuffer.from_state_dict: unsupported version {state.get('version')!r} "
                f"(expected {STATE_VERSION})"
            )
        buf = cls(config)
        for i, raw in enumerate(state.get("entries", [])):
            where = f"PendingRewardBuffer.from_state_dict: entry {i}"
            try:
                buf.add(
                    fragment_id=raw["fragment_id"],
                    user_id=raw["user_id"],
                    decision_id=raw["decision_id"],
                    r_proxy=raw["r_proxy"],
                    created_ref=raw.get("created_ref"),
                )
                entry = buf._entries[raw["fragment_id"]]
                for j, trig in enumerate(raw.get("triggers", [])):
                    if not isinstance(trig, (list, tuple)) or len(trig) != 2:
                        raise ValueError(f"trigger {j} must be [r_qual, turn_ref], got {trig!r}")
                    entry.triggers.append((_score(trig[0], f"trigger {j} r_qual"), _json_value(trig[1], "turn_ref")))
                if "status" in raw and raw["status"] != entry.status:
                    raise ValueError(f"status {raw['status']!r} disagrees with its triggers ({entry.status!r})")
            except KeyError as err:
                raise ValueError(f"{where}: missing field {err}") from err
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from err
        stats = state.get("stats", {})
        for key in _STAT_KEYS:
            value = stats.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"PendingRewardBuffer.from_state_dict: stats[{key!r}] must be an int >= 0")
            buf._stats[key] = value
        return buf
