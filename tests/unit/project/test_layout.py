"""The tree is the architecture (docs/pages/design.md): programs at entrypoints/' top level, the job library in
rooms below, and imports that run one way, at module level."""

import ast
import configparser
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from helpers import REPO
from posttrain.components.spec.registry import SPEC_CLASSES

ROOTS = {"components": "posttrain.components", "entrypoints": "posttrain.entrypoints"}


def modules() -> Dict[str, Path]:
    """Every posttrain module, by its dotted name."""
    found = {}
    for top, dotted in ROOTS.items():
        for path in (REPO / top).rglob("*.py"):
            parts = [part for part in path.relative_to(REPO / top).with_suffix("").parts if part != "__init__"]
            found[".".join([dotted, *parts])] = path
    return found


def posttrain_imports(path: Path, known: Dict[str, Path]) -> Tuple[Set[str], List[str]]:
    """The posttrain modules ``path`` imports at module level, and its imports of posttrain inside functions."""
    at_top: Set[str] = set()
    inside: List[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                targets = [
                    f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in known else child.module
                    for a in child.names
                ]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
                continue
            for target in (t for t in targets if t.startswith("posttrain.")):
                if in_function:
                    inside.append(f"{path.relative_to(REPO)}:{child.lineno} imports {target}")
                else:
                    at_top.add(target)

    visit(ast.parse(path.read_text()), False)
    return at_top, inside


def test_entrypoints_top_level_holds_only_programs() -> None:
    not_programs = [
        path.name
        for path in sorted((REPO / "entrypoints").glob("*.py"))
        if path.name != "__init__.py" and 'if __name__ == "__main__":' not in path.read_text()
    ]
    assert not_programs == [], "modules a component does not run belong in a room below entrypoints/"


def test_no_import_circles_and_no_posttrain_imports_inside_functions() -> None:
    known = modules()
    graph, inside = {}, []
    for name, path in known.items():
        graph[name], found = posttrain_imports(path, known)
        inside += found
    assert inside == []

    def circle_from(start: str, trail: List[str]) -> List[str]:
        for target in sorted(graph.get(trail[-1], ())):
            if target == start:
                return trail
            if target not in trail and target in graph and target not in cleared:
                found = circle_from(start, trail + [target])
                if found:
                    return found
        return []

    circles, cleared = [], set()
    for name in sorted(graph):
        circle = circle_from(name, [name])
        if circle:
            circles.append(" -> ".join(circle))
        cleared.add(name)
    assert circles == []


def room_of(name: str, known: Dict[str, Path]) -> Optional[str]:
    """The room (a folder of components/ or entrypoints/) module ``name`` lives in; None at a side's top level."""
    package = ".".join(name.split(".")[:3])
    return package if package != name and known[package].name == "__init__.py" else None


def test_no_two_rooms_import_each_other() -> None:
    """Imports between rooms run one way: the runtime above the rooms it drives, the process plumbing below them."""
    known = modules()
    arrows: Dict[Tuple[str, str], str] = {}
    for name, path in known.items():
        targets, _ = posttrain_imports(path, known)
        for target in targets:
            rooms = (room_of(name, known), room_of(target, known))
            if None not in rooms and rooms[0] != rooms[1]:
                arrows.setdefault(rooms, f"{name} -> {target}")
    two_way = [f"{arrows[(a, b)]} and {arrows[(b, a)]}" for a, b in sorted(arrows) if a < b and (b, a) in arrows]
    assert two_way == []


def test_no_module_is_a_hub() -> None:
    """A module over 500 lines holds more than one concern: split by concern (design.md, "Two sides, one import
    root")."""
    long = {name: lines for name, path in modules().items() if (lines := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_each_room_has_a_unit_room_of_its_name() -> None:
    """tests/unit mirrors the code: a room's fast tests in tests/unit/<room>/."""
    rooms = {path.parent.name for top in ROOTS for path in (REPO / top).glob("*/__init__.py")}
    without = sorted(room for room in rooms if not list((REPO / "tests" / "unit" / room).glob("test_*.py")))
    assert without == []


def test_the_job_library_imports_no_program_and_the_client_no_job_library() -> None:
    """The user's tools (plot) may read both."""
    known = modules()
    programs = {f"posttrain.entrypoints.{p.stem}" for p in (REPO / "entrypoints").glob("*.py") if p.stem != "__init__"}
    wrong = []
    for name, path in known.items():
        targets, _ = posttrain_imports(path, known)
        if name.startswith("posttrain.components") and not name.startswith("posttrain.components.tools"):
            wrong += [f"{name} -> {t}" for t in targets if t.startswith("posttrain.entrypoints")]
        elif name not in programs:
            wrong += [f"{name} -> {t}" for t in targets & programs]
    assert wrong == []


def test_the_job_library_names_no_algorithm() -> None:
    """What an algorithm is lives in its spec class or its entrypoint; trainers/ holds PPO's own code. ``reward``
    is also a metric's name, which the summary and the curves read."""
    names = set(SPEC_CLASSES) - {"reward"}
    rooms = [path for path in (REPO / "entrypoints").glob("*/*.py") if path.parent.name != "trainers"]
    found = []
    for path in rooms:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None
        }
        found += [
            f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings
        ]
    assert found == []


def test_the_spec_is_read_once_where_the_job_splits_it() -> None:
    """A whole spec (a training's ``Spec``, an evaluation's ``EvalSpec``, a chain's ``ChainSpec``) is a parameter of
    five functions at most: those that split it into parts (job/spec_parts.py, evaluation/parts.py) and the training
    steps that read the algorithm's class; every other job function takes its part, as ``sharding.Strategy`` takes
    ``distributed``."""
    takers = []
    for path in (REPO / "entrypoints").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(
                    argument.annotation is not None
                    and ast.unparse(argument.annotation) in ("Spec", "EvalSpec", "ChainSpec")
                    for argument in arguments
                ):
                    takers.append(f"{path.relative_to(REPO)}:{node.name}")
    assert sorted(takers) == [
        "entrypoints/evaluation/parts.py:parts",
        "entrypoints/job/checks.py:check_inputs",
        "entrypoints/job/config.py:training_arguments",
        "entrypoints/job/runtime.py:_train",
        "entrypoints/job/spec_parts.py:parts",
    ]


def test_every_package_of_the_tree_installs() -> None:
    """setup.cfg lists its packages one by one: a folder with an __init__.py missing there is missing from a wheel
    (the templates' tasksets, agents and tools are run from one)."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    roots = {**ROOTS, "templates": "posttrain.templates"}
    found = {
        ".".join([roots[top], *init.parent.relative_to(REPO / top).parts])
        for top in roots
        for init in (REPO / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set()
