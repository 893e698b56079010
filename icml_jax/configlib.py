"""One rule for turning config blocks into dataclasses: merge overrides, and a key the class lacks is an error."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def known_fields(cls: type, values: Mapping[str, Any] | Any | None = None, **overrides: Any) -> dict[str, Any]:
    """`values` (an ml_collections ConfigDict, a mapping or None) merged with `overrides`, checked against the
    fields of dataclass `cls`; an unknown key raises ValueError naming the class and the key, so a typo in a
    config never passes silently."""
    merged = dict(values.to_dict() if hasattr(values, "to_dict") else values or {})
    merged.update(overrides)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; known: {sorted(known)}")
    return merged
