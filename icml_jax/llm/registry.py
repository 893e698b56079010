"""Build a back end from a config block (`kind` + that back end's knobs); other back ends register here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from icml_jax.llm.types import LLMBackend

T = TypeVar("T")
BackendFactory = Callable[[Mapping[str, Any]], LLMBackend]
_FACTORIES: dict[str, BackendFactory] = {}


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict from an ml_collections ConfigDict, a dataclass, a mapping or None."""
    if cfg is None:
        return {}
    if hasattr(cfg, "to_dict"):
        return dict(cfg.to_dict())
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return dict(cfg)
    raise TypeError(f"cannot read a back-end config from {type(cfg).__name__}")


def dataclass_from_config(cls: type[T], cfg: Any, *, ignore: tuple[str, ...] = ("kind",)) -> T:
    """Instantiate dataclass `cls` from `cfg`; unknown keys are an error that names them (typos fail loudly)."""
    values = {k: v for k, v in config_to_dict(cfg).items() if k not in ignore}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown config key(s) {unknown}; known: {sorted(names)}")
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in values and isinstance(values[f.name], list):
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def register_backend(kind: str, factory: BackendFactory) -> None:
    """Make `make_backend({'kind': kind, ...})` call `factory(config_dict)` (e.g. the local Flax back end)."""
    _FACTORIES[kind] = factory


def available_backends() -> list[str]:
    """Kinds make_backend knows."""
    return sorted(_FACTORIES)


def make_backend(cfg: Any, **kwargs: Any) -> LLMBackend:
    """Build the back end named by `cfg.kind` ('gemini', 'offline', or a registered one)."""
    values = config_to_dict(cfg)
    kind = values.get("kind")
    if kind not in _FACTORIES:
        raise ValueError(f"unknown LLM back end kind {kind!r}; available: {available_backends()}")
    return _FACTORIES[kind](values, **kwargs) if kwargs else _FACTORIES[kind](values)


def _gemini(values: Mapping[str, Any], **kwargs: Any) -> LLMBackend:
    from icml_jax.llm.gemini import GeminiBackend, GeminiConfig

    return GeminiBackend(dataclass_from_config(GeminiConfig, values), **kwargs)


def _offline(values: Mapping[str, Any]) -> LLMBackend:
    from icml_jax.llm.offline import OfflineBackend

    extra = sorted(set(values) - {"kind"})
    if extra:
        raise ValueError(f"offline back end takes no options, got {extra}")
    return OfflineBackend()


register_backend("gemini", _gemini)
register_backend("offline", _offline)
