"""Build a back end from a config block (`kind` + that back end's knobs); other back ends register here."""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from icml_jax.llm.gemini import GeminiBackend, GeminiConfig
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.openai_compat import OpenAIBackend, OpenAIConfig
from icml_jax.llm.types import LLMBackend

T = TypeVar("T")
BackendFactory = Callable[[Mapping[str, Any]], LLMBackend]
_FACTORIES: dict[str, BackendFactory] = {}
_OPTIONS: dict[str, frozenset[str]] = {}
_CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {}
_KEY_VARIABLES: dict[str, tuple[str, Callable[[Mapping[str, Any]], tuple[str, ...]]]] = {}
_CONTEXT: dict[str, Callable[[Mapping[str, Any]], int]] = {}
logger = logging.getLogger(__name__)


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


def dataclass_from_config(cls: type[T], cfg: Any, *, ignore: tuple[str, ...] = ("kind",),
                          unset_if_none: tuple[str, ...] = ()) -> T:
    """Instantiate dataclass `cls` from `cfg`; unknown keys are an error that names them (typos fail loudly).
    A key of `unset_if_none` holding None takes the class default (a shared block's "this kind's own default")."""
    values = {k: v for k, v in config_to_dict(cfg).items()
              if k not in ignore and not (k in unset_if_none and v is None)}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown config key(s) {unknown}; known: {sorted(names)}")
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in values and isinstance(values[f.name], list):
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def register_backend(kind: str, factory: BackendFactory, options: Iterable[str] = (),
                     check: Callable[[Mapping[str, Any]], None] | None = None,
                     key_variables: tuple[str, Callable[[Mapping[str, Any]], tuple[str, ...]]] | None = None,
                     context_tokens: Callable[[Mapping[str, Any]], int] | None = None) -> None:
    """Make `make_backend({'kind': kind, ...})` call `factory(options)` (e.g. the local Flax back end).

    `options`: the keys this kind takes besides `kind` (what `resolve_options` keeps); `check`: validates a
    block's options without building anything (no model load, no connection), for the up-front config check;
    `key_variables`: (the kind's name in messages, options -> the environment variables its API key is read from);
    `context_tokens`: options -> the remote model's input window (kinds without one run a local model).
    """
    _FACTORIES[kind] = factory
    _OPTIONS[kind] = frozenset(options)
    _CHECKS[kind] = check or (lambda values: None)
    if key_variables is not None:
        _KEY_VARIABLES[kind] = key_variables
    else:
        _KEY_VARIABLES.pop(kind, None)
    if context_tokens is not None:
        _CONTEXT[kind] = context_tokens
    else:
        _CONTEXT.pop(kind, None)


def remote_context_tokens(cfg: Any, where: str = "back end") -> int | None:
    """The input window of the block's remote model (its kind's `context_tokens`, e.g. Gemini's 1,048,576), or
    None for a kind without one (offline, local: their context is the local model's)."""
    values = resolve_options(cfg, where)
    context = _CONTEXT.get(values["kind"])
    if context is None:
        return None
    try:
        return int(context(values))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def kind_default(kind: str | None, key: str) -> Any:
    """The value a block of `kind` takes for `key` when it holds None (a knob that cannot be None): the kind's
    config class default; None for a kind without that option (offline, local)."""
    return getattr(_remote_config(kind, {}), key) if is_remote(kind) and key in _OPTIONS.get(kind or "", ()) \
        else None


def api_key_variables(values: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(the kind's display name, the environment variables its API key is read from) of a resolved block
    (`check_backend`'s output); ("", ()) for a kind, or a keyless server, that needs no key."""
    name, variables = _KEY_VARIABLES.get(values["kind"], ("", lambda _: ()))
    env = tuple(variables(values))
    return (name, env) if env else ("", ())


def available_backends() -> list[str]:
    """Kinds make_backend knows."""
    return sorted(_FACTORIES)


def resolve_options(cfg: Any, where: str = "back end") -> dict[str, Any]:
    """The block's `kind` and the options of that kind.

    A block switched to another kind on the command line (`--config.llm.judge.kind=offline`) still holds the old
    kind's options: keys another registered kind takes are dropped with a warning naming them; a key no kind
    takes is a typo and an error naming it. `where` (e.g. 'config.llm.judge') starts every message.
    """
    values = config_to_dict(cfg)
    kind = values.get("kind")
    if kind not in _FACTORIES:
        raise ValueError(f"{where}: unknown LLM back end kind {kind!r}; available: {available_backends()}")
    others = set().union(*(opts for k, opts in _OPTIONS.items() if k != kind))
    unknown = sorted(k for k in values if k != "kind" and k not in _OPTIONS[kind] and k not in others)
    if unknown:
        raise ValueError(f"{where}: unknown config key(s) {unknown} for the {kind!r} back end; it takes "
                         f"{sorted(_OPTIONS[kind]) or 'no options'}")
    dropped = sorted(k for k in values if k != "kind" and k not in _OPTIONS[kind] and values[k] is not None)
    if dropped:
        logger.warning("%s: kind %r ignores the other back ends' option(s) %s", where, kind, dropped)
    return {"kind": kind, **{k: v for k, v in values.items() if k in _OPTIONS[kind]}}


def check_backend(cfg: Any, where: str = "back end") -> dict[str, Any]:
    """Validates a back-end block without building it (kind, keys, values); returns its resolved options."""
    values = resolve_options(cfg, where)
    try:
        _CHECKS[values["kind"]](values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return values


def make_backend(cfg: Any, **kwargs: Any) -> LLMBackend:
    """Build the back end named by `cfg.kind` ('gemini', 'openai', 'offline', or a registered one)."""
    values = resolve_options(cfg)
    kind = values["kind"]
    return _FACTORIES[kind](values, **kwargs) if kwargs else _FACTORIES[kind](values)


_REMOTE: dict[str, type] = {"gemini": GeminiConfig, "openai": OpenAIConfig}  # the kinds a switchable block serves
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "tuple": tuple}


def _admits_none(field: dataclasses.Field) -> bool:
    return "None" in str(field.type)


@functools.cache
def _unset_if_none(cls: type) -> tuple[str, ...]:
    """The knobs of `cls` that cannot be None, so None there means "this kind's default": a block shared by several
    kinds (switched with --config.llm.<role>.kind=...) holds them as None, e.g. the API-key variables, which
    differ per kind, and structured_output (Gemini json_schema, OpenAI-compatible auto)."""
    return tuple(f.name for f in dataclasses.fields(cls) if not _admits_none(f))


@functools.cache
def switchable_knobs() -> Mapping[str, type]:
    """The remote kinds' knobs that read None as their kind's default (those that cannot be None, and those whose
    default is None), with their types: a block holding every one of them as None takes any kind on the command
    line (`kind`, then the knobs that matter, e.g. base_url, model and api_key_env). timeout_tokens_per_s is not
    one (None there means "timeout_s alone")."""
    knobs: dict[str, type] = {}
    for cls in _REMOTE.values():
        for f in dataclasses.fields(cls):
            if f.default is None or not _admits_none(f):
                knobs.setdefault(f.name, _TYPES[str(f.type).replace(" ", "").split("|")[0].split("[")[0]])
    return types.MappingProxyType(knobs)


def set_options(block: Mapping[str, Any]) -> dict[str, Any]:
    """A back-end block without the switchable knobs it holds as None (its kind's defaults): two blocks that
    build the same back end compare equal whether or not they carry the placeholders."""
    knobs = switchable_knobs()
    return {k: v for k, v in config_to_dict(block).items() if v is not None or k not in knobs}


def is_remote(kind: str | None) -> bool:
    """Whether `kind` is one of the remote kinds whose knobs switchable_knobs() lists."""
    return kind in _REMOTE


def _remote_config(kind: str, values: Mapping[str, Any]) -> Any:
    """The config dataclass of remote `kind` from a block's resolved options (None: the kind's default)."""
    cls = _REMOTE[kind]
    return dataclass_from_config(cls, values, unset_if_none=_unset_if_none(cls))


def _gemini_config(values: Mapping[str, Any]) -> Any:
    return _remote_config("gemini", values)


def _openai_config(values: Mapping[str, Any]) -> Any:
    return _remote_config("openai", values)


def _openai(values: Mapping[str, Any], **kwargs: Any) -> LLMBackend:
    return OpenAIBackend(_openai_config(values), **kwargs)


def _gemini(values: Mapping[str, Any], **kwargs: Any) -> LLMBackend:
    return GeminiBackend(_gemini_config(values), **kwargs)


def _offline(values: Mapping[str, Any]) -> LLMBackend:
    extra = sorted(set(values) - {"kind"})
    if extra:
        raise ValueError(f"offline back end takes no options, got {extra}")
    return OfflineBackend()


def _fields(cls: type) -> list[str]:
    """The field names of config dataclass `cls` (a kind's options)."""
    return [f.name for f in dataclasses.fields(cls)]


def _register_builtin() -> None:
    """Registers the back ends shipped here: gemini, openai (any OpenAI-compatible server) and offline."""
    register_backend("gemini", _gemini, _fields(GeminiConfig), check=_gemini_config,
                     key_variables=("Gemini", lambda values: _gemini_config(values).api_key_env),
                     context_tokens=lambda values: _gemini_config(values).context_tokens)
    register_backend("openai", _openai, _fields(OpenAIConfig), check=_openai_config,
                     key_variables=("OpenAI-compatible", lambda values: _openai_config(values).api_key_env),
                     context_tokens=lambda values: _openai_config(values).context_tokens)


_register_builtin()
register_backend("offline", _offline)
