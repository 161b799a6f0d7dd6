"""The house of components/ stands: imports run only downward through its rooms, and no module imports itself
back through others (docs/design.md opens with the map).

    release/     publish, stage, tune, gate, promote, canary, reconcile: what a release does, in rooms of its own:
        step_settings    the list of steps and each one's settings type
        gate/, promote/  the gate (its report shows quality's); promote, the canary, rollout, reconcile
        tune/, quality/  the measuring steps before the gate
        (release/*.py)   what they share: publish, stage, results, effects, effect_plot, gate_turn
    serving/     Triton reached: its admin API, replicas, perf_analyzer, metrics      (beside repository/)
    repository/  the S3 model repository: versions, manifests, desired state, history, leases
    model/       what a model is: signature, export, compile, parity, config, folder, ensemble
    ground       components/*.py: errors, log, settings (every named default), the S3 client

The check reads the source (ast), so it sees imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COMPONENTS = Path(__file__).resolve().parent.parent / "components"
FLOORS = {"": 0, "model": 1, "serving": 2, "repository": 2, "release": 3}  # rooms of one floor never import each other
RELEASE_FLOORS = {"": 0, "tune": 1, "quality": 1, "gate": 2, "promote": 2, "step_settings": 3}  # release's own


def room(module: str) -> str:
    """components.model.compile and components.model -> model; components.log -> "" (the ground floor)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else ""


def release_room(module: str) -> str:
    """components.release.gate.report -> gate; components.release.results -> "" (release's ground)."""
    parts = module.split(".")
    return parts[2] if room(module) == "release" and len(parts) > 2 and parts[2] in RELEASE_FLOORS else ""


def _across(mine: str, theirs: str, floors: dict[str, int]) -> str:
    """'beside' or 'above' when a module of room `mine` may not import from room `theirs`, else ''."""
    if mine == theirs or floors[theirs] < floors[mine]:
        return ""
    return "beside" if floors[theirs] == floors[mine] else "above"


def imports(root: Path) -> dict[str, list[tuple[str, str]]]:
    """module -> [(module it imports, the name imported)] for every import of a module under `root`."""
    package = root.name
    modules = {_module(root, p): p for p in root.rglob("*.py")}
    found: dict[str, list[tuple[str, str]]] = {m: [] for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"  # `from pkg import module` imports the module
                    imported = target if target in modules else node.module
                    if imported.split(".")[0] == package:
                        found[module].append((imported, alias.name))
            elif isinstance(node, ast.Import):
                found[module] += [(a.name, a.name) for a in node.names if a.name.split(".")[0] == package]
    return found


def violations(root: Path) -> list[str]:
    """Every upward or sideways import between rooms, and every circle, each in one sentence."""
    graph = imports(root)
    files = {_module(root, p): str(p.relative_to(root.parent)) for p in root.rglob("*.py")}
    _file = files.__getitem__
    problems = []
    for module, targets in graph.items():
        for target, name in targets:
            mine, theirs = room(module), room(target)
            where, rooms = _across(mine, theirs, FLOORS), (mine or "ground", theirs or "ground")
            if not where and mine == theirs == "release":
                mine, theirs = release_room(module), release_room(target)
                where, rooms = _across(mine, theirs, RELEASE_FLOORS), (f"release/{mine}", f"release/{theirs}")
            if where:
                problems.append(
                    f"{_file(module)} ({rooms[0]}) imports {name} from {_file(target)} ({rooms[1]}), a room {where} it"
                )
    problems += [f"a circle of imports: {' -> '.join(_file(m) for m in cycle)}" for cycle in _cycles(graph)]
    return problems


def _module(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _cycles(graph: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (depth-first search; a package's face is skipped)."""
    edges = {m: sorted({t for t, _ in ts if t in graph and t != m}) for m, ts in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles, path = [], []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in edges[module]:
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return cycles


def test_components_imports_run_only_downward_and_never_in_a_circle():
    assert violations(COMPONENTS) == []


def test_every_room_says_what_it_is_for():
    for name in [*FLOORS, *(f"release/{r}" for r in RELEASE_FLOORS if (COMPONENTS / "release" / r).is_dir())]:
        face = COMPONENTS / name / "__init__.py"
        docstring = ast.get_docstring(ast.parse(face.read_text()))
        assert docstring and len(docstring.splitlines()[0]) > 20, f"{face} needs a first line that says what it holds"


@pytest.fixture
def house(tmp_path: Path) -> Path:
    """A small copy of the rooms: a settings module on the ground floor, a model, a server client, a release."""
    root = tmp_path / "components"
    files = {
        "__init__.py": "",
        "settings.py": "LIMIT = 1\n",
        "model/__init__.py": "",
        "model/signature.py": "from components.settings import LIMIT\n",
        "serving/__init__.py": "",
        "serving/admin.py": "from components.model import signature\n",
        "repository/__init__.py": "",
        "repository/store.py": "from components import settings\n",
        "release/__init__.py": "",
        "release/promote/promote.py": "from components.serving.admin import signature\nfrom components.repository import store\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_check_names_an_upward_import_and_what_it_imports(house):
    assert violations(house) == []
    (house / "settings.py").write_text(
        "LIMIT = 1\n\n\ndef late():\n    from components.release.promote.promote import store\n"
    )
    found = violations(house)
    assert found[0] == (
        "components/settings.py (ground) imports store from components/release/promote/promote.py (release), a room above it"
    )
    # and it closes circles: settings -> promote -> store -> settings, settings -> promote -> admin -> signature -> ...
    assert len(found) == 3 and all(p.startswith("a circle of imports: components/") for p in found[1:])
    assert all("components/settings.py -> components/release/promote/promote.py" in p for p in found[1:])


def test_the_check_names_an_upward_import_between_rooms_of_release(house):
    (house / "release" / "results.py").write_text("from components.release.promote import promote\n")
    assert violations(house) == [
        "components/release/results.py (release/) imports promote from components/release/promote/promote.py "
        "(release/promote), a room above it"
    ]


def test_the_check_names_a_sideways_import_between_rooms_of_one_floor(house):
    (house / "repository" / "store.py").write_text("from components.serving import admin\n")
    assert violations(house) == [
        "components/repository/store.py (repository) imports admin from components/serving/admin.py (serving), "
        "a room beside it"
    ]


def test_every_module_is_at_most_400_lines():
    """The project's rule for every Python module, tests and benchmarks included: a longer one is split by what
    its parts are about."""
    root = COMPONENTS.parent
    modules = [
        p for d in ("components", "pipelines", "tests", "benchmarks", "scripts") for p in (root / d).rglob("*.py")
    ]
    assert len(modules) > 100
    assert {str(p.relative_to(root)): n for p in modules if (n := len(p.read_text().splitlines())) > 400} == {}
