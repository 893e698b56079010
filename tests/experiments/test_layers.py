"""The package's layering, top to bottom: the experiments; the entry points (`main`, `evaluate`, `chat`,
`erasure`, the Memory API), thin; the evaluation and the baselines (`evaluate`'s and the experiments': `main`, the
chat, the run layer and the library never import them); the run layer (`icml_jax.run`: spec, flags, validation,
builders, pipeline and stages, workdir, metrics log, loading a trained agent); the library (agents, rl, train,
synthesis, llm, models, data, memory, checkpoint, with the process, config and text helpers). Nothing imports a
layer above its own, no library module imports the `icml_jax.main` entry point, the LLM back ends know nothing of
the synthesis that uses them, no import cycle joins two packages or top-level modules (function-local imports
counted) or two modules, and a function-local import of the package says why it is one."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import icml_jax

ROOT = Path(icml_jax.__file__).parent
TOP = ("icml_jax.experiments", "icml_jax.evaluation", "icml_jax.evaluate", "icml_jax.baselines",
       "icml_jax.memory_api")
LIBRARY = ("agents", "rl", "train", "synthesis", "llm", "models", "data", "memory", "checkpoint", "parallel.py",
           "configlib.py", "textcheck.py", "cpu_rng.py")
BELOW = (*LIBRARY, "run", "main.py", "chat.py", "erasure.py")
ENTRY = "icml_jax.main"  # only entry points import it: `python -m icml_jax.main`, notebooks, scripts
ENTRY_POINTS = ("icml_jax.main", "icml_jax.evaluate", "icml_jax.chat", "icml_jax.erasure", "icml_jax.memory_api")
MAX_LOCAL_IMPORTS = 40  # function-local imports of the package (issue 55: each keeps a heavy dependency or a flag
# definition off a path that does not need it, and says so in a `# local:` comment)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def _files(part: str) -> list[Path]:
    path = ROOT / part
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(path: Path, *, in_functions: bool) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import statement, whether it sits in a function) of a file; `if TYPE_CHECKING:` blocks left out, and the
    imports inside functions only with `in_functions`."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                for other in child.orelse:
                    visit_one(other, local)
                continue
            visit_one(child, local)

    def visit_one(node: ast.AST, local: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, local))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if in_functions:
                visit(node, True)
        else:
            visit(node, local)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def _targets(path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The absolute module names an import statement names (`from a import b`: a and a.b)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    module = node.module or ""
    if node.level:  # relative: resolved against the importing module's package
        package = _module(path).split(".")
        package = package if path.name == "__init__.py" else package[:-1]
        module = ".".join(package[:len(package) - node.level + 1] + ([module] if module else []))
    return {module} | {f"{module}.{a.name}" for a in node.names}


def _unit(module: str) -> str | None:
    """The package or top-level module of `icml_jax` that `module` is in (None: not ours, or the root)."""
    parts = module.split(".")
    if parts[0] != "icml_jax" or len(parts) < 2:
        return None
    if (ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").is_file():
        return f"icml_jax.{parts[1]}"
    return None


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of `graph` as the path that closes it ([] when there is none)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


@pytest.mark.parametrize("part", BELOW)
def test_nothing_below_imports_the_top_layer(part):
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files(part) for m in _imports(f) if m.startswith(TOP)}
    assert not bad, f"modules below the experiments layer import it: {sorted(bad)}"


def test_no_library_module_imports_the_main_entry_point():
    files = [f for f in sorted(ROOT.rglob("*.py")) if f != ROOT / "main.py"]
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in files for m in _imports(f)
           if m == ENTRY or m.startswith(f"{ENTRY}.")}
    assert not bad, f"library modules import the entry point {ENTRY}: {sorted(bad)}"


@pytest.mark.parametrize("part", (*LIBRARY, "run", "evaluation", "baselines"))
def test_nothing_below_the_entry_points_imports_one(part):
    """The entry points are thin and on top: the run layer, the library, the evaluation and the baselines import
    none of them (the experiments, on top of everything, may)."""
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files(part) for m in _imports(f)
           if any(m == e or m.startswith(f"{e}.") for e in ENTRY_POINTS)}
    assert not bad, f"modules below the entry points import one: {sorted(bad)}"


def test_the_entry_points_do_not_import_each_other():
    """Each entry point stands on the run layer and the library (the chat, the evaluation and the Memory API load a
    trained agent with `icml_jax.run.agent_loading`, not through each other)."""
    bad = {f"{f.relative_to(ROOT)}: {m}" for e in ENTRY_POINTS for f in _files(f"{e.split('.')[1]}.py")
           for m in _imports(f) if any((m == o or m.startswith(f"{o}.")) and o != e for o in ENTRY_POINTS)}
    assert not bad, sorted(bad)


@pytest.mark.parametrize("part", LIBRARY)
def test_the_library_does_not_import_the_run_layer(part):
    """The run layer stands on the library, never the other way: the checkpoints write their files with
    `checkpoint.files.write_text_atomic` and the workdir (`icml_jax.run.workdir`) imports the checkpoints, not the
    reverse (that pair was the package's one import cycle)."""
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files(part) for m in _imports(f)
           if m == "icml_jax.run" or m.startswith("icml_jax.run.")}
    assert not bad, f"library modules import the run layer: {sorted(bad)}"


def test_the_workdir_imports_the_checkpoints_and_not_the_reverse():
    workdir = _imports(ROOT / "run" / "workdir.py")
    assert any(m.startswith("icml_jax.checkpoint") for m in workdir)
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("checkpoint") for m in _imports(f)
           if m.startswith("icml_jax.run")}
    assert not bad, sorted(bad)


def test_no_import_cycle_between_packages_and_top_level_modules():
    """Each subpackage of icml_jax and each top-level module is one node; an edge for every import of another, at
    any depth (a function-local import hides no cycle from this test; `if TYPE_CHECKING:` imports are left out)."""
    graph: dict[str, set[str]] = {}
    for f in sorted(ROOT.rglob("*.py")):
        unit = _unit(_module(f))
        if unit is None:
            continue
        for node, _ in _import_nodes(f, in_functions=True):
            graph.setdefault(unit, set()).update(u for m in _targets(f, node)
                                                 if (u := _unit(m)) is not None and u != unit)
    assert not _cycle(graph), f"import cycle: {' -> '.join(_cycle(graph))}"


def test_no_import_cycle_between_modules():
    """Module by module, the imports a module runs when it is imported (those at module level; importing `a.b.c`
    runs `a.b` first) form no cycle: no module can meet another half-initialised, whichever is imported first."""
    files = {_module(f): f for f in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}  # its packages: running
        edges = graph.setdefault(name, set())
        for node, _ in _import_nodes(f, in_functions=False):
            for target in _targets(f, node):
                parts = target.split(".")
                for i in range(2, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    if dep in files and dep != name and dep not in own:
                        edges.add(dep)
    assert not _cycle(graph), f"import cycle: {' -> '.join(_cycle(graph))}"


def test_a_function_local_import_of_the_package_says_why():
    """Imports sit at the top of a module. One inside a function keeps a heavy or optional dependency (or the
    absl flag definitions) off a path that does not need it, and says so in a `# local:` comment on its line or
    the line above; there are fewer than MAX_LOCAL_IMPORTS."""
    local, unexplained = [], []
    for f in sorted(ROOT.rglob("*.py")):
        lines = f.read_text(encoding="utf-8").splitlines()
        for node, in_function in _import_nodes(f, in_functions=True):
            if not in_function or not any(m.startswith("icml_jax") for m in _targets(f, node)):
                continue
            where = f"{f.relative_to(ROOT)}:{node.lineno}"
            local.append(where)
            if not any("# local:" in lines[i] for i in (node.lineno - 1, node.lineno - 2) if i >= 0):
                unexplained.append(where)
    assert not unexplained, f"function-local imports without a `# local:` reason: {unexplained}"
    assert len(local) < MAX_LOCAL_IMPORTS, local


def test_the_memory_package_imports_nothing_above_it():
    """The stores know nothing of the agents, the chat, the learner or the Memory facade built on them."""
    above = ("icml_jax.chat", "icml_jax.agents", "icml_jax.memory_api", "icml_jax.rl", "icml_jax.train",
             "icml_jax.run", ENTRY)
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("memory") for m in _imports(f) if m.startswith(above)}
    assert not bad, sorted(bad)


def test_the_models_import_only_the_models_and_the_process_helpers():
    """The backbone package stands alone: it may use `icml_jax.parallel`, nothing else of the package."""
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("models") for m in _imports(f)
           if m.startswith("icml_jax") and not m.startswith(("icml_jax.models", "icml_jax.parallel"))
           and m != "icml_jax"}
    assert not bad, sorted(bad)


def test_the_llm_back_ends_do_not_import_the_synthesis():
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("llm") for m in _imports(f)
           if m.startswith("icml_jax.synthesis")}
    assert not bad, sorted(bad)


def test_configs_do_not_import_the_experiments():
    configs = Path(__file__).parents[2] / "configs"
    bad = {f"{f.name}: {m}" for f in configs.glob("*.py") for m in _imports(f) if m.startswith(TOP)}
    assert not bad, sorted(bad)


def test_the_demo_config_trains_as_the_persona_world_experiment():
    """configs/demo.py spells out the experiment's model and PPO settings; they must not drift apart."""
    from icml_jax.experiments.persona_run import PersonaRunConfig
    from tests.config_files import load_config

    config, run = load_config("demo"), PersonaRunConfig()
    assert (config.model.hidden, config.model.layers) == (run.hidden, run.layers)
    assert (config.policy.pooling, config.policy.match_rank) == (run.pooling, run.match_rank)
    for key, value in dataclasses.asdict(run.ppo).items():
        if key in ("actor_lr", "critic_lr", "gamma", "entropy_coef", "epochs", "minibatch_size"):
            assert config.rl.ppo[key] == value, key
    assert config.rl.reward.save_cost == run.reward.save_cost
    assert dict(config.observation) == dataclasses.asdict(run.observation)


def test_an_unregistered_offline_task_is_an_error_not_a_default_answer():
    from icml_jax.llm import offline
    from icml_jax.llm.offline import OfflineBackend, register_offline_answers
    from icml_jax.llm.types import LLMRequest

    backend = OfflineBackend()
    with pytest.raises(ValueError, match="no answer for task 'made_up_task'"):
        backend.generate([LLMRequest(prompt="x", task="made_up_task")])
    register_offline_answers(["made_up_task"], lambda task, md: f"{task}:{md['x']}")
    try:
        assert backend.generate([LLMRequest(prompt="x", task="made_up_task", metadata={"x": 1})])[0].text == \
            "made_up_task:1"
        with pytest.raises(ValueError, match="already answered"):
            register_offline_answers(["made_up_task"], lambda task, md: "other")
    finally:
        offline._ANSWERS.pop("made_up_task")


MAX_FUNCTION_LINES = 80  # issue 55: a function longer than this does more than one job
MAX_TOP_LEVEL_MODULES = 10  # `__init__.py` included: the rest sits in packages by job


def test_functions_stay_short_and_the_top_level_small():
    functions = [(f, n) for f in sorted(ROOT.rglob("*.py")) for n in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [f"{f.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for f, n in functions
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"
