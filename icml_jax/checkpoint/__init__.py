"""Every checkpoint of a run in one place: the flat-array format and its compatibility check (`arrays`), the
policy file the warm-up writes and the chat loads (`policy_file`), and the online run's checkpoint
(`run`: policy, optimizer, JSON state, memory and data position). The HF-format adapter export stays in
`icml_jax.models.export` (a model-format concern of the backbone package, which imports nothing above it)."""

from icml_jax.checkpoint.arrays import (
    TRAINABLE,
    CheckpointError,
    check_compatible,
    flat_arrays,
    index_of,
    restore_arrays,
    state_index,
)
from icml_jax.checkpoint.policy_file import (
    META_FILE,
    STATE_DIR,
    flat_trainable,
    load_warmup,
    param_index,
    read_warmup_metadata,
    save_policy_arrays,
    save_warmup,
)
from icml_jax.checkpoint.run import RunCheckpointer, load_memory_state, memory_state

__all__ = [
    "META_FILE",
    "STATE_DIR",
    "TRAINABLE",
    "CheckpointError",
    "RunCheckpointer",
    "check_compatible",
    "flat_arrays",
    "flat_trainable",
    "index_of",
    "load_memory_state",
    "load_warmup",
    "memory_state",
    "param_index",
    "read_warmup_metadata",
    "restore_arrays",
    "save_policy_arrays",
    "save_warmup",
    "state_index",
]
