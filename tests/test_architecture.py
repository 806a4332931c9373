"""The shape of the package: layers, no import circle, no private reads.

Read from the source with `ast` (module-level imports and imports inside
functions alike), so these tests run without TensorFlow and fail on the first
change that breaks the house rules of `docs/architecture.md`.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kerastower"

# Each module may import modules of its own layer or below, never above. A
# name ending in "." stands for every module of that package.
LAYERS = [
    # The fence around private Keras and TensorFlow, and plain-Python helpers.
    [
        "kerastower._keras_compat.",
        "kerastower._errors",
        "kerastower._functional_variants",
        "kerastower.tower_choice",
        "kerastower._installed_keras",
        # The workers wing spans three layers, so its modules are listed one
        # by one here; its public modules' old paths sit beside them.
        "kerastower.workers",
        "kerastower.workers.cluster",
        "kerastower.cluster",
        "kerastower.workers.configs",
        "kerastower.workers.slurm",
        "kerastower.workers.group",
        "kerastower.workers.heartbeats",
        "kerastower.workers.private_network",
    ],
    # This process's devices and cluster, and the public plain functions.
    [
        "kerastower.devices",
        "kerastower.strategy",
        "kerastower.scaling",
        "kerastower.workers.multi_worker",
        "kerastower.multi_worker",
        "kerastower.workers.launch",
        "kerastower.launch",
    ],
    ["kerastower.reduce."],  # every sum across towers, workers, replicas
    ["kerastower.step."],  # one step over this worker's towers
    ["kerastower.model", "kerastower.entry_points", "kerastower.data"],
    ["kerastower.on_jax."],  # `TowerModel` on Keras's JAX backend
    [
        "kerastower.callbacks.",
        "kerastower.workers.evaluator",
        "kerastower.evaluator",
        "kerastower.testing.",
    ],
    ["kerastower", "kerastower._startup"],  # the public face
    ["kerastower.cli.", "kerastower.__main__"],  # the command line: a leaf
]

# Reads of an underscore attribute that are not another module's private
# state, each with the reason.
ALLOWED_PRIVATE_READS = {
    # The fence: the one package that reads private Keras and TensorFlow
    # attributes, each checked against the installed version.
    "kerastower._keras_compat.": "the private-Keras fence",
    # Public names that begin with an underscore.
    "os._exit": "exits at once from the grace-period timer thread",
    "_fields": "namedtuple's public field list",
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    name = ".".join(parts)
    return name.removesuffix(".__init__")


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The kerastower modules that module `name` imports, anywhere in it."""
    found = set()
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1]]
                    + ([base] if base else [])
                )
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def layer_of(name: str) -> int:
    for rank, members in enumerate(LAYERS):
        for member in members:
            if name == member or (
                member.endswith(".") and (name + ".").startswith(member)
            ):
                return rank
    raise AssertionError(f"{name} is in no layer of LAYERS: add it there")


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_import_circle():
    circles = []
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == "open":
                circles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_no_import_runs_back_up_the_layers():
    upward = sorted(
        f"{name} (layer {layer_of(name)}) imports {dep} (layer {layer_of(dep)})"
        for name, deps in GRAPH.items()
        for dep in deps
        if layer_of(dep) > layer_of(name)
    )
    assert not upward, "\n".join(upward)


def test_library_code_never_imports_the_command_line():
    importers = sorted(
        name
        for name, deps in GRAPH.items()
        if any(d == "kerastower.cli" or d.startswith("kerastower.cli.") for d in deps)
        and not name.startswith("kerastower.cli")
        and name != "kerastower.__main__"
    )
    assert importers == []


def private_reads(name: str) -> list[str]:
    """Underscore attributes `name` reads off anything but itself."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super":
                continue
            attr, text = node.attr, ast.unparse(node)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            if getattr(node.args[0], "id", "") in ("self", "cls"):
                continue
            attr, text = node.args[1].value, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    continue  # a private module, imported whole
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
            continue
        if attr and attr.startswith("_") and not attr.startswith("__"):
            if text not in ALLOWED_PRIVATE_READS and attr not in ALLOWED_PRIVATE_READS:
                found.append(text)
    return found


def test_no_module_reads_another_modules_private_attributes():
    fenced = [m for m in ALLOWED_PRIVATE_READS if m.endswith(".")]
    reads = {
        f"{name}:{read}"
        for name in MODULES
        if not any((name + ".").startswith(m) for m in fenced)
        for read in private_reads(name)
    }
    assert sorted(reads) == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("model._gradient_accumulator = None", ["model._gradient_accumulator"]),
        (
            'getattr(model, "_shown_warnings", ())',
            ["getattr(model, '_shown_warnings', ())"],
        ),
        ("from kerastower.cli import _parser", ["from kerastower.cli import _parser"]),
        ("self._own = 1\nsuper()._hook()\nos._exit(1)", []),
    ],
)
def test_the_private_read_check_can_fail(tmp_path, monkeypatch, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "probe", path)
    assert private_reads("probe") == expected


def test_the_circle_and_layer_checks_can_fail(monkeypatch):
    # The circle the package had: cli -> demo -> model -> multi_worker -> cli.
    worker = "kerastower.workers.multi_worker"
    monkeypatch.setitem(GRAPH, worker, {"kerastower.cli.command"})
    with pytest.raises(AssertionError, match="multi_worker"):
        test_no_import_runs_back_up_the_layers()
    with pytest.raises(AssertionError):
        test_library_code_never_imports_the_command_line()
    monkeypatch.setitem(GRAPH, "kerastower.cli.command", {worker})
    with pytest.raises(AssertionError, match="import circles"):
        test_no_import_circle()


# What the JAX wing may import: itself and the plain-Python modules shared by
# both backends. Nothing of TensorFlow's side, which a JAX install lacks.
JAX_WING = ("kerastower.on_jax", "kerastower._keras_compat.jax")
SHARED = (
    "kerastower._errors",
    "kerastower._functional_variants",
    "kerastower._installed_keras",
    "kerastower._keras_compat.keras3_functional",
    "kerastower.tower_choice",
)


def _in(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def jax_wing_leaks(graph) -> list[str]:
    """Imports crossing between the JAX wing and TensorFlow's side."""
    leaks = []
    for name, deps in graph.items():
        for dep in deps:
            if _in(name, JAX_WING) and not _in(dep, JAX_WING + SHARED):
                leaks.append(f"{name} imports {dep}")
            # The package's face and the command line choose a backend.
            chooses = name == "kerastower" or _in(name, ("kerastower.cli",))
            if _in(dep, JAX_WING) and not _in(name, JAX_WING) and not chooses:
                leaks.append(f"{name} imports {dep}")
    return sorted(leaks)


def test_the_jax_wing_and_tensorflow_side_do_not_import_each_other(monkeypatch):
    assert "kerastower.on_jax.model" in GRAPH  # the parser saw the wing
    assert "kerastower._keras_compat.jax" in GRAPH["kerastower.on_jax.model"]
    assert jax_wing_leaks(GRAPH) == []
    monkeypatch.setitem(GRAPH, "kerastower.on_jax.steps", {"kerastower.model"})
    monkeypatch.setitem(GRAPH, "kerastower.step.checks", {"kerastower.on_jax"})
    assert jax_wing_leaks(GRAPH) == [
        "kerastower.on_jax.steps imports kerastower.model",
        "kerastower.step.checks imports kerastower.on_jax",
    ]


# The workers wing's public modules at the paths they had before the wing:
# each hands on its module's names, for users. The library imports the
# module where the code is, so that patching a module patches the code.
OLD_PATHS = {
    "kerastower.cluster": "kerastower.workers.cluster",
    "kerastower.multi_worker": "kerastower.workers.multi_worker",
    "kerastower.evaluator": "kerastower.workers.evaluator",
    "kerastower.launch": "kerastower.workers.launch",
}


def old_path_imports(graph) -> list[str]:
    """Imports of an old path by anything but the package's face."""
    return sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        for dep in deps
        if dep in OLD_PATHS and name != "kerastower"
    )


def test_the_library_imports_the_workers_wing_where_its_code_is(monkeypatch):
    for old, new in OLD_PATHS.items():
        assert GRAPH[old] == {new}, f"{old} should import {new} only"
    assert old_path_imports(GRAPH) == []
    monkeypatch.setitem(GRAPH, "kerastower.model", {"kerastower.cluster"})
    assert old_path_imports(GRAPH) == ["kerastower.model imports kerastower.cluster"]


# Code lines: what a reader reads as code, docstrings, comments and blank
# lines apart, so that prose never has to move to pass the check.
CODE_LINES = 300


def code_lines(text: str) -> int:
    """The lines of `text` that are code: no docstring, comment or blank."""
    prose = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (
            isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in prose
    )


def test_modules_stay_under_about_300_code_lines():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := code_lines(path.read_text())) > CODE_LINES
    }
    assert long == {}


def test_the_code_line_count_leaves_prose_out_and_can_fail():
    text = (
        '"""Doc.\n\nMore."""\n\n# why\nx = 1\n\n\n'
        'def f():\n    """Doc."""\n    return x\n'
    )
    assert code_lines(text) == 3
    assert code_lines("x = 1\n" * (CODE_LINES + 1)) > CODE_LINES


def test_the_import_parser_sees_the_real_package():
    # Guards every check above against passing on an empty or misread graph.
    assert len(MODULES) >= 100
    known = {
        "kerastower.model": "kerastower.step.tower_step",
        "kerastower.workers.launch": "kerastower.workers.group",
        "kerastower.cluster": "kerastower.workers.cluster",
        "kerastower.step.tower_step": "kerastower.reduce.gradients",
        "kerastower.on_jax.model": "kerastower._keras_compat.jax",
        "kerastower.cli.command": "kerastower.cli.launch_command",
        "kerastower": "kerastower.model",
    }
    for name, dep in known.items():
        assert dep in GRAPH[name], f"{name} should import {dep}"


def documented_modules(text: str) -> set[str]:
    """The module paths that the tree of docs/architecture.md lists."""
    tree = text.split("```text", 1)[1].split("```", 1)[0].strip().splitlines()[1:]
    listed, stack = set(), []
    for line in tree:
        match = re.match(r"^((?:│   |    )*)(?:├── |└── )(\S+)", line)
        assert match, f"not a tree line: {line!r}"
        stack = stack[: len(match.group(1)) // 4] + [match.group(2)]
        listed.add("".join(stack))
    return listed


def test_the_architecture_page_lists_every_module():
    listed = documented_modules((ROOT.parent / "docs" / "architecture.md").read_text())
    missing = sorted(
        rel
        for path in ROOT.rglob("*.py")
        if (rel := path.relative_to(ROOT).as_posix()) == "__init__.py"
        or not rel.endswith("__init__.py")
        if rel not in listed
    )
    assert missing == []
    assert documented_modules("```text\nkerastower/\n└── a.py   one\n```") == {"a.py"}
