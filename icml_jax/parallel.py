"""Logical-axis sharding: parameters carry names (embed, heads, ...), a rules table maps them to mesh axes."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# MaxText-style rules: each logical axis -> mesh axis (or axes, or None = replicated). First match wins.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
)


def logical_to_spec(
    axes: Sequence[str | None] | None, rules: Sequence[tuple[str, str | tuple[str, ...] | None]] = DEFAULT_RULES,
    mesh: Mesh | None = None,
) -> PartitionSpec:
    """The PartitionSpec of an array whose dimensions have logical names `axes`.

    A mesh axis is used at most once per array, and axes missing from `mesh` (when given) are dropped, so one
    rules table serves meshes of any shape.
    """
    if not axes:
        return PartitionSpec()
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name in axes:
        target = table.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used and (mesh is None or n in mesh.axis_names))
        used.update(names)
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*out)


def named_sharding(mesh: Mesh, axes: Sequence[str | None] | None, rules=DEFAULT_RULES) -> NamedSharding:
    """NamedSharding of an array with logical axes `axes` on `mesh`."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh))


def single_device_mesh() -> Mesh:
    """A 1x1x1 (data, fsdp, tensor) mesh on the first device, so the same code runs on one CPU."""
    return jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
