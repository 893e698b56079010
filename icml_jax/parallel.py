"""Meshes, logical-axis sharding rules and multi-host start-up.

Parameters carry logical axis names (embed, heads, ...) in their `logical_axes` metadata; a MaxText-style rules
table maps each name to mesh axes (data, fsdp, tensor). The same code runs on one CPU (a 1x1x1 mesh), one GPU,
a multi-GPU host and a multi-host TPU pod slice; `initialize()` joins the processes of a multi-host run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
from ml_collections.config_dict import placeholder
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, "str | tuple[str, ...] | None"]]

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

# MaxText-style rules: each logical axis -> mesh axis (or axes, or None = replicated). First match wins.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),  # the leading axis of stacked block parameters: every device holds all layers of its shard
)


def default_config() -> ml_collections.ConfigDict:
    """The `parallel` config block: mesh shape (-1 = the remaining devices), rules, multi-host settings."""
    return ml_collections.ConfigDict(
        dict(
            mesh=dict(data=1, fsdp=-1, tensor=1),
            rules=DEFAULT_RULES,
            distributed=dict(
                # placeholders (None with a type) so `--config.parallel.distributed.x=...` can set them
                coordinator_address=placeholder(str),  # "host:port" of process 0; env JAX_COORDINATOR_ADDRESS
                num_processes=placeholder(int),  # env JAX_NUM_PROCESSES
                process_id=placeholder(int),  # env JAX_PROCESS_ID
                local_device_ids=placeholder(tuple),  # env JAX_LOCAL_DEVICE_IDS (read by jax)
                auto_detect=False,  # let jax find the cluster (Cloud TPU pod, SLURM, Open MPI); env JAX_AUTO_DETECT
                cpu_collectives=placeholder(str),  # "gloo" for multi-process CPU runs
                initialization_timeout=300,
            ),
        )
    )


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """The `parallel` block typed: the mesh shape, the logical-axis rules and how the processes join; a key the
    block (or its mesh / distributed part) leaves out takes `default_config()`'s value (the one place these
    defaults are written)."""

    mesh: Mapping[str, int]
    rules: tuple[tuple[str, str | tuple[str, ...] | None], ...]
    distributed: Mapping[str, Any]

    @classmethod
    def from_config(cls, block: Any) -> ParallelConfig:
        """From the `parallel` block (a ConfigDict, a mapping or None: the defaults); an unknown key is an error."""
        given = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
        defaults = default_config().to_dict()
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ValueError(f"config.parallel: unknown key(s) {unknown}; known: {sorted(defaults)}")
        mesh, distributed = ({**defaults[k], **dict(given.get(k) or {})} for k in ("mesh", "distributed"))
        return cls(mesh=mesh, rules=rules_from(given.get("rules", defaults["rules"])), distributed=distributed)


def rules_from(rules: Any) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """A rules table as tuples, from the config's (possibly list-typed) form; validates each entry."""
    out = []
    for entry in rules:
        if len(entry) != 2 or not isinstance(entry[0], str):
            raise ValueError(f"sharding rule {entry!r} is not a (logical axis, mesh axes) pair")
        name, target = entry
        if target is not None and not isinstance(target, str):
            target = tuple(target)
        out.append((name, target))
    return tuple(out)


def logical_to_spec(
    axes: Sequence[str | None] | None,
    rules: Rules = DEFAULT_RULES,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """The PartitionSpec of an array whose dimensions have logical names `axes`.

    A mesh axis is used at most once per array, and axes missing from `mesh` (when given) are dropped, so one
    rules table serves meshes of any shape. With `mesh` and `shape`, mesh axes that do not divide a dimension
    are dropped too (that dimension is replicated instead), e.g. Gemma3-1B's single kv head on tensor=2.
    """
    if not axes:
        return PartitionSpec()
    if shape is not None and len(shape) != len(axes):
        raise ValueError(f"logical axes {tuple(axes)} do not match an array of shape {tuple(shape)}")
    table: dict[str, Any] = {}
    for name, target in rules:
        table.setdefault(name, target)
    used: set[str] = set()
    out = []
    for i, name in enumerate(axes):
        target = table.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used and (mesh is None or n in mesh.axis_names))
        if mesh is not None and shape is not None:
            while names and shape[i] % math.prod(mesh.shape[n] for n in names):
                names = names[:-1]
        used.update(names)
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*out)


def named_sharding(
    mesh: Mesh, axes: Sequence[str | None] | None, rules: Rules = DEFAULT_RULES, shape: Sequence[int] | None = None
) -> NamedSharding:
    """NamedSharding of an array with logical axes `axes` (and optionally `shape`) on `mesh`."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh, shape))


def resolve_mesh_shape(spec: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Sizes of (data, fsdp, tensor) from `spec`; one axis may be -1 = whatever the other axes leave over."""
    unknown = set(spec) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh spec {dict(spec)} has unknown axes {sorted(unknown)}; axes are {MESH_AXES}")
    sizes = [int(spec.get(name, 1)) for name in MESH_AXES]
    fill = [i for i, s in enumerate(sizes) if s == -1]
    if len(fill) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh spec {dict(spec)}: sizes must be positive, with at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if fill:
        if num_devices % known:
            raise ValueError(f"mesh spec {dict(spec)} does not fit {num_devices} devices: "
                             f"{num_devices} is not a multiple of {known}")
        sizes[fill[0]] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh spec {dict(spec)} needs {math.prod(sizes)} devices but {num_devices} are available")
    return tuple(sizes)


def make_mesh(spec: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes), Auto axis types."""
    spec = dict(spec if spec is not None else default_config().mesh)
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(spec, len(devices))
    return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def single_device_mesh() -> Mesh:
    """A 1x1x1 (data, fsdp, tensor) mesh on the first device, so the same code runs on one CPU."""
    return make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.local_devices()[:1])


def place(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """Puts a host or device value onto `sharding`, sending each device only its shard.

    Works for shardings that span several processes (each process passes the same full value): host data goes
    through `make_array_from_callback`, so no device ever holds more than its shard.
    """
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(value)
        return jax.random.wrap_key_data(place(jax.random.key_data(value), sharding), impl=impl)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.device_put(value, sharding)  # already global: a resharding
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def variable_sharding(var: nnx.Variable, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Where a variable belongs: by its `logical_axes` metadata, replicated when it has none."""
    shape = np.shape(var.get_raw_value())
    axes = var.get_metadata().get("logical_axes")
    if axes is None or len(axes) != len(shape):
        axes = None
    return named_sharding(mesh, axes, rules, shape)


def shard_model(node: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Places every variable of an NNX graph node (model, optimizer) on `mesh` by its logical axes; in place."""
    state = nnx.state(node)
    leaves = []
    for path, var in nnx.to_flat_state(state):
        value = var.get_raw_value()
        if isinstance(value, (jax.Array, np.ndarray)) or np.isscalar(value):
            value = place(value, variable_sharding(var, mesh, rules))
        leaves.append((path, var.replace(value)))
    nnx.update(node, nnx.from_flat_state(leaves))
    return node


def model_mesh(node: Any) -> Mesh | None:
    """The mesh the parameters of `node` live on (None when they are not NamedSharded)."""
    for _, var in nnx.to_flat_state(nnx.state(node, nnx.Param)):
        sharding = getattr(var.get_raw_value(), "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def global_batch(local: Any, mesh: Mesh, axes: Sequence[str | None] = ("batch",), rules: Rules = DEFAULT_RULES):
    """This process's rows of a batch (NumPy, any pytree) -> global arrays sharded over the batch axes.

    Each process passes the rows it loaded (data loading shards by `jax.process_index()`); on one process the
    local batch is the global batch.
    """

    def one(x):
        x = np.asarray(x)
        names = tuple(axes) + (None,) * (x.ndim - len(axes))
        sharding = named_sharding(mesh, names, rules)
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(one, local)


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in the run."""

    process_index: int
    process_count: int
    local_device_count: int
    device_count: int


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def initialize(config: Mapping[str, Any] | None = None, **overrides: Any) -> ProcessInfo:
    """Joins a multi-process run through `jax.distributed.initialize`; a no-op for a single process.

    Settings come from keyword `overrides`, then the `config` block (`parallel.distributed`), then the
    environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_AUTO_DETECT=1). With
    `auto_detect`, jax discovers the cluster itself (Cloud TPU pod slices, SLURM, Open MPI). Call it first,
    before anything touches a device; calling it again after a successful start is a no-op.
    """
    settings = dict(default_config().distributed)
    settings.update({k: v for k, v in dict(config or {}).items() if v is not None})
    unknown = set(overrides) - set(settings)
    if unknown:
        raise TypeError(f"initialize() got unknown settings {sorted(unknown)}; known: {sorted(settings)}")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    address = settings["coordinator_address"] or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    num = settings["num_processes"] if settings["num_processes"] is not None else _env_int("JAX_NUM_PROCESSES")
    pid = settings["process_id"] if settings["process_id"] is not None else _env_int("JAX_PROCESS_ID")
    auto = bool(settings["auto_detect"]) or os.environ.get("JAX_AUTO_DETECT", "").lower() in ("1", "true", "yes")

    if not jax.distributed.is_initialized():
        if settings["cpu_collectives"]:
            jax.config.update("jax_cpu_collectives_implementation", settings["cpu_collectives"])
        if auto:
            jax.distributed.initialize(address, num, pid, settings["local_device_ids"],
                                       initialization_timeout=int(settings["initialization_timeout"]))
        elif (num or 1) > 1 or address is not None:
            missing = [n for n, v in (("coordinator_address", address), ("num_processes", num),
                                      ("process_id", pid)) if v is None]
            if missing:
                raise ValueError(f"multi-process start needs {', '.join(missing)} (config parallel.distributed, "
                                 "or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or "
                                 "auto_detect=True on a TPU pod / SLURM / Open MPI)")
            if num > 1:
                jax.distributed.initialize(address, num, pid, settings["local_device_ids"],
                                           initialization_timeout=int(settings["initialization_timeout"]))
    return ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


# ------------------------------------------------------------------------------------- several processes


def process_meshes(spec: Mapping[str, int] | None = None) -> tuple[Mesh, Mesh]:
    """(global, local) meshes of a run whose processes each play their own users.

    The global mesh spans every device of every process; its `data` axis is split over the processes (a
    hybrid mesh: process p holds `data` rows [p*d/P, (p+1)*d/P), fsdp and tensor stay inside a process), so a
    parameter sharded by the rules (which never use `data`) has a full copy on every process's devices. The
    local mesh is this process's block of it: the model plays there, and the update runs on the global mesh
    over the very same device buffers (`to_mesh`). With one process both are the same mesh.
    """
    spec = dict(spec if spec is not None else default_config().mesh)
    count = jax.process_count()
    shape = resolve_mesh_shape(spec, jax.device_count())
    if count == 1:
        mesh = make_mesh(spec)
        return mesh, mesh
    if shape[0] % count:
        raise ValueError(f"mesh spec {spec} gives data={shape[0]}, which is not a multiple of the {count} JAX "
                         f"processes: each process needs whole data rows (a full copy of the model on its own "
                         f"devices); e.g. data={count} and fsdp=-1")
    per = (shape[0] // count, *shape[1:])
    from jax.experimental import mesh_utils

    devices = mesh_utils.create_hybrid_device_mesh(per, (count, 1, 1), jax.devices(), process_is_granule=True)
    auto = (jax.sharding.AxisType.Auto,) * len(shape)
    mesh = Mesh(devices, MESH_AXES, axis_types=auto)
    rows = [i for i in range(shape[0]) if all(d.process_index == jax.process_index() for d in devices[i].flat)]
    if len(rows) != per[0] or rows != list(range(rows[0], rows[0] + per[0])):
        raise ValueError(f"mesh {shape}: process {jax.process_index()}'s devices do not form whole data rows")
    return mesh, Mesh(devices[rows[0]: rows[0] + per[0]], MESH_AXES, axis_types=auto)


def to_mesh(tree: Any, mesh: Mesh) -> Any:
    """Every NamedSharded array of `tree` on `mesh` with the same PartitionSpec, built from the same device
    buffers (no copy): between a process's local mesh and the global mesh that contains it, for specs that do
    not use the axes the two differ in. Typed PRNG keys go through their key data; other leaves pass."""

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding) or x.sharding.mesh == mesh:
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(one(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        target = NamedSharding(mesh, x.sharding.spec)
        shards = {s.device: s.data for s in x.addressable_shards}
        wanted = target.addressable_devices
        if set(shards) != wanted:
            raise ValueError(f"to_mesh: an array of shape {x.shape} on devices {sorted(d.id for d in shards)} "
                             f"cannot move to a mesh whose addressable devices are {sorted(d.id for d in wanted)}")
        return jax.make_array_from_single_device_arrays(x.shape, target, [shards[d] for d in wanted])

    return jax.tree.map(one, tree)


def to_host(tree: Any) -> Any:
    """Host (NumPy) copies of a pytree's arrays, also of global arrays that span processes (then a collective:
    every process must call it at the same point)."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(one, tree)


def allgather_objects(obj: Any) -> list[Any]:
    """`obj` of every process, in process order (pickled through two all-gathers: lengths, then bytes); a
    collective: every process calls it at the same point. One process: `[obj]`, nothing sent."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]


def barrier(name: str) -> None:
    """Waits until every process reaches `name` (nothing to wait for in one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def is_primary() -> bool:
    """Whether this process writes the run's shared files (metrics, progress, the final policy)."""
    return jax.process_index() == 0
