"""Shared test setup: float32 matmuls at full precision so parity checks test the math, not the back end."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# The tests compile hundreds of small programs, each run a few times: XLA's CPU compiler at LLVM -O1 and with its
# classic fusion emitters compiles them in about half the time and runs them about as fast (docs/testing.md has the
# measurement). Every process the tests start inherits the flags. ICML_TEST_XLA_DEFAULTS=1 runs the suite with
# XLA's own defaults, the compiler path users get.
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false"
if not os.environ.get("ICML_TEST_XLA_DEFAULTS") and FAST_COMPILE_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{FAST_COMPILE_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# One persistent XLA compilation cache for the processes the tests start (runs killed and resumed, CLIs, the
# notebooks' kernels): they compile the same programs, and the cache compiles each once. Set after jax is
# imported, so this process keeps its in-memory cache only (its compile-count checks stay exact).
_XLA_CACHE = tempfile.mkdtemp(prefix="icml_jax_tests_xla_cache_")
atexit.register(shutil.rmtree, _XLA_CACHE, True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _XLA_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# Under pytest-xdist (`-n 2 --dist loadfile --no-loadscope-reorder`, the README's command) each test file runs
# whole on one worker, and the files are handed out in collection order: the slowest go first, so the workers
# do not end with one long file running alone. Only the order of files changes, and only under xdist.
SLOWEST_FIRST = (
    "tests/models/test_real_models.py",
    "tests/experiments/test_experiments.py",
    "tests/train/test_warmup.py",
    "tests/rl/test_learning.py",
    "tests/test_main_multihost.py",
    "tests/test_notebooks.py",
    "tests/test_resume.py",
    "tests/test_main.py",
    "tests/test_evaluate.py",
    "tests/rl/test_learner.py",
    "tests/test_multihost.py",
    "tests/test_chat.py",
)


def pytest_collection_modifyitems(config, items):
    """Slowest test files first when an xdist worker collects (each worker must collect the same order)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
