"""The evaluation's answer cache (`<workdir>/eval/cache.sqlite`): `icml_jax.llm.cache`, re-exported here for the
evaluation's importers; the synthesis uses the same cache, so it lives in the llm layer."""

from __future__ import annotations

from icml_jax.llm.cache import CachedBackend, ResponseCache, request_key

__all__ = ["CachedBackend", "ResponseCache", "request_key"]
