"""The command-line pieces shared by `icml_jax.main`, `icml_jax.chat`, `icml_jax.evaluate` and
`icml_jax.experiments`: the --config / --workdir / --debug flags (defined here, once), flag parsing that turns a
bad override into one line, the user errors a CLI prints as one line with status 2, and quieter logs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import flags, logging
from ml_collections import config_flags

from icml_jax.checkpoint import CheckpointError
from icml_jax.configlib import ConfigError
from icml_jax.data.report import DataError
from icml_jax.llm.types import BackendError, MissingAPIKeyError
from icml_jax.memory.store import MemoryStoreError
from icml_jax.models.config import ModelConfigError
from icml_jax.models.safetensors_io import CheckpointError as WeightsError
from icml_jax.rl.divergence import DivergenceError

CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file, e.g. configs/demo.py",
                                         lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "directory for metrics.jsonl and the stages' outputs")
DEBUG = flags.DEFINE_bool("debug", False, "show the traceback of an error a user can cause (a config, data, "
                          "checkpoint or back-end problem) instead of its one-line message")


def quiet_info_logs() -> None:
    """absl logging at WARNING unless --verbosity was given: Orbax logs every save and restore at INFO."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def ignoring_closed_event_loops(hook: Callable[[Any], object]) -> Callable[[Any], None]:
    """`hook` (a sys.unraisablehook) minus the "Event loop is closed" reports a failed Orbax restore leaves behind.

    When one array of a checkpoint cannot be read, the restore's other TensorStore reads finish after Orbax closed
    its event loop, and each reports that as an unraisable RuntimeError: a traceback per tensor after the one-line
    error. Every other report goes to `hook`.
    """

    def filtered(unraisable: Any) -> None:
        exc = getattr(unraisable, "exc_value", None)
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        hook(unraisable)

    return filtered


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a user causes (a config, data file, checkpoint, back end or diverging setting) and fixes from
    the message alone: the CLIs print them as one line and exit with status 2; anything else is a bug."""
    return (ConfigError, CheckpointError, DivergenceError, BackendError, MissingAPIKeyError, MemoryStoreError,
            *_extra_user_errors())


def _extra_user_errors() -> tuple[type[BaseException], ...]:
    """Data and model-file errors (their modules name what failed: file, record, tensor)."""
    return (DataError, ModelConfigError, WeightsError)


def user_error(exc: BaseException) -> BaseException | None:
    """The user error behind `exc` (itself or a cause it was raised from), or None for a bug."""
    errors = user_errors()
    while exc is not None:
        if isinstance(exc, errors):
            return exc
        exc = exc.__cause__
    return None


def fail(tool: str, exc: BaseException, debug: bool) -> NoReturn:
    """Ends a CLI on a user error: one `<tool> error: ...` line on stderr and status 2 (--debug: the traceback)."""
    if debug:
        raise exc
    print(f"{tool} error: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)


def _override_path(argv: Sequence[str], exc: BaseException) -> str:
    """The `--config.a.b` override of `argv` that names the key `exc` complains about (or all of them)."""
    text = " ".join(str(e) for e in (exc, exc.__context__, exc.__cause__) if e is not None)
    overrides = [a.split("=", 1)[0] for a in argv if a.startswith("--config.")]
    named = [o for o in overrides if any(f"'{part}'" in text for part in o.split(".")[1:])]
    return ", ".join(named or overrides) or "the --config flag"


def split_none_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(argv without its `--config.KEY=None` overrides, those KEYs): ml_collections would read "None" as the text
    of a str key and refuse it for a number, where every config documents None as "unset"."""
    rest, keys = [], []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and value == "None" and name.startswith("--config.") and len(name) > len("--config."):
            keys.append(name[len("--config."):])
        else:
            rest.append(arg)
    return rest, keys


def set_to_none(config: Any, keys: Sequence[str]) -> None:
    """Sets each dotted key of `config` to None; ConfigError naming the flag when the config lacks the key."""
    for key in keys:
        *parents, leaf = key.split(".")
        block = config
        for part in parents:
            block = block.get(part) if hasattr(block, "get") else None
        if not hasattr(block, "get") or leaf not in block:
            raise ConfigError(f"--config.{key}=None: no such key in the config file; the config file's keys are the "
                              "ones to override")
        block[leaf] = None


def parse_flags(argv: Sequence[str], tool: str = "config") -> list[str]:
    """absl's flag parsing, with a command-line override of a key the config lacks (or of a wrong type) ending
    in one line naming the flag instead of a traceback from ml_collections; `--config.KEY=None` sets KEY to None."""
    original = list(argv)
    argv, none_keys = split_none_overrides(original)
    try:
        rest = flags.FLAGS(list(argv))
        if none_keys:
            if CONFIG.value is None:
                raise ConfigError(f"--config.{none_keys[0]}=None needs --config=FILE")
            set_to_none(CONFIG.value, none_keys)
        return rest
    except ConfigError as exc:
        fail(tool, exc, "--debug" in argv)
    except flags.Error as exc:
        fail(tool, ConfigError(f"{exc}; --helpfull lists the flags"), "--debug" in argv)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        where = _override_path(original, exc)
        fail(tool, ConfigError(f"{where}: no such key in the config file, or a value of the wrong type "
                               f"({type(exc).__name__}: {exc}); the config file's keys are the ones to override"),
             "--debug" in argv)
    raise AssertionError("unreachable")  # pragma: no cover
