"""Shared test setup: float32 matmuls at full precision so parity checks test the math, not the back end."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# One persistent XLA compilation cache for the processes the tests start (runs killed and resumed, CLIs, the
# notebooks' kernels): they compile the same programs, and the cache compiles each once. Set after jax is
# imported, so this process keeps its in-memory cache only (its compile-count checks stay exact).
_XLA_CACHE = tempfile.mkdtemp(prefix="icml_jax_tests_xla_cache_")
atexit.register(shutil.rmtree, _XLA_CACHE, True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _XLA_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
