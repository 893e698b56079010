"""Per-user long-term memory: versioned fragments with provenance in SQLite, lexical prefilter, saving via
condensation. The Mem0-shaped `Memory` API stands on top of this package, the chat and the agents:
`icml_jax.memory_api`."""

from icml_jax.memory.fragment import Fragment, MemoryEvent, NewFragment, fragment_id_for
from icml_jax.memory.lexical import bm25_scores, most_similar, tokenize
from icml_jax.memory.store import EXPORT_FORMAT, SCHEMA_VERSION, MemoryStore, MemoryStoreError
from icml_jax.memory.writer import TurnToSave, save_turns

__all__ = [
    "EXPORT_FORMAT",
    "Fragment",
    "MemoryEvent",
    "MemoryStore",
    "MemoryStoreError",
    "NewFragment",
    "SCHEMA_VERSION",
    "TurnToSave",
    "bm25_scores",
    "fragment_id_for",
    "most_similar",
    "save_turns",
    "tokenize",
]
