"""The run config's `data` block, typed: which episodes a run plays online and is evaluated on. Each default is
written once, here (configs/base.py builds its block from `DataConfig().to_dict()`); `DataConfig.from_config` is
the one place that reads the ml_collections block."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from icml_jax.configlib import known_fields
from icml_jax.data.persona_world import PersonaWorldConfig

PERSONA_WORLD = "persona_world"
REAL_DATASETS = ("msc", "cc", "gapchat", "locomo")
DATASETS = (PERSONA_WORLD, *REAL_DATASETS)
# None by default: the ml_collections block holds a typed placeholder, so `--config.data.<key>=...` can set it
DATA_NULLABLE = {"tfds_name": str, "split": str, "data_dir": str, "manual_dir": str, "max_session_turns": int}


def _is_int(value: Any) -> bool:
    """An int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """- `name`: persona_world | msc | cc | gapchat | locomo.
    - `tfds_name` / `split` / `data_dir`: real data: the built TFDS builder/config (e.g. "msc_episodes/parlai"),
      its split and the TFDS data_dir holding the built ArrayRecord files; `manual_dir`: the raw files the builder
      reads (nothing is downloaded).
    - `world`: the persona world (name == "persona_world").
    - `train_episodes`: episodes played online (per process; >= 1); `eval_episodes`: the persona world's
      held-out episodes (>= 0).
    - `train_final_sessions`: real data: False plays each episode without its final session (the evaluation's
      target, so nothing the evaluation scores ever trains the policy); True plays it too (the evaluation then
      refuses a policy that trained on an evaluated episode's final session).
    - `max_session_turns`: real data: every session (online and in the evaluation) cut to its first N turns
      (>= 2: the final session keeps a target); None: whole sessions.
    """

    name: str = PERSONA_WORLD
    tfds_name: str | None = None
    split: str | None = None
    data_dir: str | None = None
    manual_dir: str | None = None
    world: PersonaWorldConfig = dataclasses.field(default_factory=PersonaWorldConfig)
    train_episodes: int = 250
    eval_episodes: int = 50
    train_final_sessions: bool = False
    max_session_turns: int | None = None

    def __post_init__(self) -> None:
        """Refuse a value no stage can run with, naming the key (`config.data.<key>`, as the user sets it)."""
        if self.name not in DATASETS:
            raise ValueError(f"config.data.name={self.name!r} is not one of {DATASETS}")
        n = self.max_session_turns
        if n is not None and (not _is_int(n) or n < 2):
            raise ValueError(f"config.data.max_session_turns must be None or an int >= 2 (the final session keeps "
                             f"at least one target), got {n!r}")
        if n is not None and self.name not in REAL_DATASETS:  # the persona world's labels address cut turns
            raise ValueError(f"config.data.max_session_turns={n} cuts real datasets' sessions ({REAL_DATASETS}); "
                             f"config.data.name={self.name!r} sizes its sessions in config.data.world")
        if not _is_int(self.train_episodes) or self.train_episodes < 1:
            raise ValueError(f"config.data.train_episodes must be an int >= 1, got {self.train_episodes!r}")
        if not _is_int(self.eval_episodes) or self.eval_episodes < 0:
            raise ValueError(f"config.data.eval_episodes must be an int >= 0, got {self.eval_episodes!r}")
        if not isinstance(self.train_final_sessions, bool):
            raise ValueError(f"config.data.train_final_sessions must be a bool, got {self.train_final_sessions!r}")

    @classmethod
    def from_config(cls, block: ml_collections.ConfigDict | Any | None) -> DataConfig:
        """From the `data` block (a ConfigDict, a mapping or None: the defaults); an unknown key is an error, and
        a bad world is named as `config.data.world`."""
        values = known_fields(cls, block)
        if "world" in values:
            try:
                values["world"] = PersonaWorldConfig.from_config(values["world"] or {})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"config.data.world: {exc}") from None
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields, the world's too (the block configs/base.py builds)."""
        world = dataclasses.asdict(self.world)
        world["fact_kinds"] = list(world["fact_kinds"])
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "world": world}


def data_config(config: ml_collections.ConfigDict | DataConfig) -> DataConfig:
    """`config` itself when it is a DataConfig, else the typed `data` block of `config`, a whole run config: the
    entry of the stream functions that a caller with only the ConfigDict calls."""
    return config if isinstance(config, DataConfig) else DataConfig.from_config(config.data)


__all__ = ["DATASETS", "DATA_NULLABLE", "PERSONA_WORLD", "REAL_DATASETS", "DataConfig", "data_config"]
