"""Checked reads of a Hugging Face `config.json` dict, shared by the decoder families and the BERT encoder."""

from __future__ import annotations

import math
from typing import Any


class ModelConfigError(ValueError):
    """A model config (HF `config.json`) that cannot describe a decoder here; names the file, the key and the value."""


_REQUIRED = object()


class ConfigKeys:
    """Checked reads of one HF config dict; errors name the source file, the key (with its path) and the value."""

    def __init__(self, hf: dict[str, Any], source: str, prefix: str = ""):
        self.hf, self.source, self.prefix = hf, source, prefix

    def error(self, key: str, value: Any, what: str) -> ModelConfigError:
        """The error for `key` = `value`, which `what` (e.g. "must be a positive integer")."""
        return ModelConfigError(f"{self.source}: {self.prefix}{key} = {value!r} {what}; fix the file or get the "
                                "checkpoint's original config.json")

    def _value(self, key: str, default: Any) -> Any:
        value = self.hf.get(key)
        if value is None and default is _REQUIRED:
            raise ModelConfigError(f"{self.source}: missing key {self.prefix}{key} (or it is null)")
        return value

    def pos_int(self, key: str, default: Any = _REQUIRED) -> Any:
        """`key` as a positive int (an integral float is accepted); `default` when absent or null."""
        value = self._value(key, default)
        if value is None:
            return default
        integral = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
        if not integral or value < 1:
            raise self.error(key, value, "must be a positive integer")
        return int(value)

    def pos_float(self, key: str, default: Any = _REQUIRED) -> Any:
        """`key` as a finite positive float; `default` when absent or null."""
        value = self._value(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.error(key, value, "must be a finite positive number")
        return float(value)

    def section(self, key: str) -> "ConfigKeys | None":
        """The nested dict under `key` (None when absent, null or empty) as its own checked reader."""
        value = self.hf.get(key)
        if value is None or value == {}:
            return None
        if not isinstance(value, dict):
            raise self.error(key, value, "must be an object")
        return ConfigKeys(value, self.source, f"{self.prefix}{key}.")
