"""Config helpers: load a config file by path from Python (as `--config=FILE:ARG` does), one rule for turning
config blocks into dataclasses (merge overrides; a key the class lacks is an error), and the error a config
that cannot run raises."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.llm.registry import kind_default, switchable_knobs

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository holding this package (configs/ lives there)
# Keys added to the config after runs were stored, each with the value that reproduces those runs: a stored config
# (a workdir's config.json, a results.json's setting) that lacks one reads as holding that value, so adding a
# key with a behaviour-preserving default leaves earlier runs resumable and their evaluations readable.
ADDED_KEYS: dict[str, Any] = {"policy.remat": "none", "eval.reply_temperature": None, "eval.memory_gain": False,
                              "rl.reward.source": "judge", "rl.reward.likelihood_scale": 0.1,
                              "rl.reward.likelihood_later_turns": 2, "rl.reward.likelihood_match": "pair",
                              "rl.reward.likelihood_control": False, "learner.notes": "model"}


class ConfigError(ValueError):
    """A config that cannot run; raised before any stage starts, naming the field and what to do."""


def load_config(spec: str | Path, overrides: Mapping[str, Any] | None = None, *,
                search: Iterable[str | Path] = ()) -> ml_collections.ConfigDict:
    """The ConfigDict of `spec` = "FILE.py[:ARG]" (`get_config(ARG)`, as `--config=FILE:ARG` gives the CLI), with
    `overrides` ({"learner.update_every": 4}, as `--config.learner.update_every=4`) applied.

    A relative FILE is looked up in the working directory, then in `search`, then in the checkout this package
    was installed from (so "configs/demo.py" works from a notebook's folder). A missing file or an unknown
    override key raises ValueError naming it.
    """
    file, _, arg = str(spec).partition(":")
    bases = [Path.cwd(), *map(Path, search), CHECKOUT]
    path = next((p for p in ([Path(file)] if Path(file).is_absolute() else [b / file for b in bases])
                 if p.is_file()), None)
    if path is None:
        raise ValueError(f"load_config: no config file {file!r} (looked in {', '.join(map(str, bases))})")
    module_spec = importlib.util.spec_from_file_location(f"icml_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    apply_overrides(config, overrides or {}, f"load_config({path}): override")
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any], what: str = "override",
                    error: type[Exception] = ValueError) -> None:
    """Sets dotted-path `overrides` ({"rl.reward.truth_lambda": 0.0}) in `config` in place; a path the config
    lacks raises `error` naming it (`what` first), so a typo never runs the unchanged config."""
    with config.unlocked():
        for key, value in overrides.items():
            *blocks, leaf = key.split(".")
            node = config
            for name in blocks:
                if not isinstance(node, ml_collections.ConfigDict) or name not in node:
                    raise error(f"{what} {key!r}: config has no field {name!r}")
                node = node[name]
            if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
                raise error(f"{what} {key!r}: config has no field {leaf!r}")
            node[leaf] = value


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b.c': leaf} of a nested JSON object."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}.{key}" if prefix else key).items()}


def _kind_defaults(flat: dict[str, Any]) -> dict[str, Any]:
    """`flat` with each back-end block's structured_output left None read as its kind's own mode (configs stored
    when the shared blocks spelt Gemini's json_schema out equal today's, which leave it to the kind), and its other
    switchable knobs left None read as absent (None there is the kind's default, as absence is)."""
    knobs = switchable_knobs()
    for key, value in list(flat.items()):
        if value is None and key.startswith("llm."):
            block, knob = key.rsplit(".", 1)
            if knob == "structured_output":
                flat[key] = kind_default(flat.get(block + ".kind"), "structured_output")
            if knob in knobs and flat[key] is None:
                del flat[key]
    return flat


def config_differences(stored: Mapping[str, Any], current: Mapping[str, Any],
                       ignore: tuple[str, ...] = ()) -> list[str]:
    """The dotted keys at which two configs (nested dicts, compared as JSON: tuples and lists alike) differ, a key
    of ADDED_KEYS that `stored` lacks but `current` holds read as its value (a block neither holds, e.g. `eval` in
    a run's stored config, is not compared); keys starting with an `ignore` prefix are not compared."""
    old, new = (_kind_defaults(flatten(json.loads(json.dumps(dict(c), default=str)))) for c in (stored, current))
    old = {**{k: v for k, v in ADDED_KEYS.items() if k in new}, **old}
    return sorted(k for k in old.keys() | new.keys()
                  if old.get(k, "<absent>") != new.get(k, "<absent>") and not k.startswith(ignore))


def known_fields(cls: type, values: Mapping[str, Any] | Any | None = None, *, where: str | None = None,
                 **overrides: Any) -> dict[str, Any]:
    """`values` (an ml_collections ConfigDict, a mapping or None) merged with `overrides`, checked against the
    fields of dataclass `cls`; an unknown key raises ValueError naming `where` (e.g. 'config.policy'; default the
    class) and the key, so a typo in a config never passes silently."""
    merged = dict(values.to_dict() if hasattr(values, "to_dict") else values or {})
    merged.update(overrides)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown key(s) {unknown}; known: {sorted(known)}")
    return merged


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name` (its factory's value for a mutable one), for code that reads a
    raw config key before the typed config is built: the fallback stays the one the dataclass defines."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"field_default: {cls.__name__}.{name} has no default")
    raise ValueError(f"field_default: {cls.__name__} has no field {name!r}")
