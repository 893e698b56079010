"""The Colab notebooks in notebooks/: committed clean (no outputs, a papermill "parameters" first code cell, an
"Open in Colab" badge), and executed top to bottom on a python3 kernel with CPU-sized parameters.

The executions run in-memory copies of the notebooks (nothing is written back to notebooks/), with the parameters
cell's values replaced by assignments appended to it (offline back ends, the tiny backbone, small sizes, workdirs
under tmp). Notebooks 01 and 03 share one trained workdir, as a user running them in order would: 03 then only
evaluates. Any cell error fails the test.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("01_quickstart.ipynb", "02_small_model.ipynb", "03_evaluate.ipynb")
BADGE = "https://colab.research.google.com/github/icml-jax/icml_jax/blob/main/notebooks/{name}"
CELL_TIMEOUT_S = 600

# the offline demo made smaller still (as tests/test_main.py's tiny_demo): 4 online episodes, 2 held out
TINY_DEMO = {"synthesis.num_seeds": 4, "data.train_episodes": 4, "data.eval_episodes": 2}
# notebook 02's tiny arm with configs/demo.py's observation buckets (one length, one candidate bucket,
# `agents.tiny.learning_observation`): its programs are then those notebook 01 compiled, read back from the
# shared compilation cache instead of compiled again (in its killed first run and in the resumed one)
DEMO_BUCKETS = {"observation.min_length_bucket": 64, "observation.max_candidates": 7,
                "observation.min_candidate_bucket": 8}


def committed_notebooks() -> list[Path]:
    """Every notebook in notebooks/ (not only the known three: a new one must be clean too)."""
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def first_code_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook's first code cell (the papermill parameters cell)."""
    return next(cell for cell in nb.cells if cell.cell_type == "code")


def cpu_parameters(name: str, workdirs: Path) -> dict[str, Any]:
    """CPU-sized parameter values for notebook `name`: offline back ends, tiny model and sizes, tmp workdirs."""
    demo = {"CONFIG": "configs/demo.py", "OVERRIDES": TINY_DEMO, "WORKDIR": str(workdirs / "demo")}
    return {
        "01_quickstart.ipynb": {**demo, "USER": "nb_test_user"},
        "02_small_model.ipynb": {"MODEL": "tiny", "JUDGE": "offline", "USE_DRIVE": False, "SIMULATE_RESTART": True,
                                 "WORKDIR": str(workdirs / "small_model"), "OVERRIDES": DEMO_BUCKETS},
        "03_evaluate.ipynb": {**demo, "BASELINES": ["no_memory", "heuristic", "mem0"],
                              "BASELINES_DIR": str(workdirs / "baselines"), "PAIRWISE": True},
    }[name]


def inject_parameters(nb: nbformat.NotebookNode, values: dict[str, Any]) -> None:
    """Appends `NAME = value` lines to the parameters cell (papermill's way: later assignments win).

    Each name must already be assigned in the cell, so a renamed parameter fails here instead of being ignored.
    A last line checks that the kernel runs this test's Python (the venv's), not another one on the PATH.
    """
    cell = first_code_cell(nb)
    for name in values:
        assert re.search(rf"^{name}\s*=", cell.source, re.M), f"parameter {name} is not in the parameters cell"
    lines = [f"{name} = {value!r}" for name, value in values.items()]
    lines.append(f"import sys as _sys; assert _sys.prefix == {sys.prefix!r}, _sys.executable")
    cell.source += "\n\n# injected by tests/test_notebooks.py\n" + "\n".join(lines) + "\n"


def execute(name: str, workdirs: Path, cwd: Path) -> nbformat.NotebookNode:
    """Runs an in-memory copy of notebooks/<name> top to bottom on the python3 kernel in `cwd`; a cell error
    raises nbclient's CellExecutionError naming the cell and the traceback."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    inject_parameters(nb, cpu_parameters(name, workdirs))
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory) -> Path:
    """Workdirs shared by the executions of this module (01 trains the demo run that 03 evaluates)."""
    return tmp_path_factory.mktemp("notebook_workdirs")


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    """One persistent JAX compilation cache for the kernels (and notebook 02's second process): the notebooks
    compile the same tiny programs, so each is compiled once. The kernels inherit it from the environment."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax_cache")))
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield


def test_the_three_notebooks_are_there():
    assert {p.name for p in committed_notebooks()} >= set(NAMES)


@pytest.mark.parametrize("path", committed_notebooks(), ids=lambda p: p.name)
def test_committed_notebooks_are_clean_with_parameters_and_a_colab_badge(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} carries outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count: clear it"
    assert "parameters" in first_code_cell(nb).metadata.get("tags", []), \
        f"{path.name}: the first code cell must be tagged 'parameters'"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and BADGE.format(name=path.name) in first.source, \
        f"{path.name}: the first cell must be the Open in Colab badge linking {BADGE.format(name=path.name)}"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


def test_a_cell_error_fails_the_execution(tmp_path):
    """The check below is worth something only if a failing cell fails it."""
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('boom')")])
    with pytest.raises(CellExecutionError, match="boom"):
        NotebookClient(nb, kernel_name="python3", timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom_on_cpu(name, workdirs, compilation_cache, tmp_path):
    before = (NOTEBOOKS / name).read_bytes()
    nb = execute(name, workdirs, tmp_path)
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    assert (NOTEBOOKS / name).read_bytes() == before, "the execution must not write into notebooks/"
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if name == "01_quickstart.ipynb":
        assert "/why:" in text and "forgot m_" in text
    if name == "02_small_model.ipynb":
        assert "killed the first run" in text or "ended before it could be killed" in text
        assert "resuming" in text or "ended before it could be killed" in text
    if name == "03_evaluate.ipynb":
        assert (workdirs / "demo" / "eval" / "results.json").is_file()
