"""`TowerModel`'s parts read of each other only what they declare.

`TowerModel` is `EntryPoints`, `TrainerHooks` (with `StepFunctionHooks`) and
`keras.Model`. A part reads ``self._x`` only where its class assigns or
defines ``_x``, inherits it from a class of its own module, or declares it
with a class annotation: the protocol that the model provides, checked here to
name what `TowerModel` really has. In the Keras fence, a name kerastower never
defines is Keras's own (``self._symbolic_build``), which the fence may read.
Read from the source with `ast`, like `test_architecture`.
"""

from __future__ import annotations

import ast

import pytest
from test_architecture import MODULES

FENCE = ("kerastower._keras_compat",)
PARTS = ("EntryPoints", "TrainerHooks", "StepFunctionHooks")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _self_attributes(node: ast.AST, contexts) -> set[str]:
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and isinstance(n.ctx, contexts)
    }


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _declared(cls: ast.ClassDef) -> set[str]:
    """The names `cls` declares with a bare annotation (its protocol)."""
    return {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign)
        and n.value is None
        and isinstance(n.target, ast.Name)
    }


def _owned(cls: ast.ClassDef) -> set[str]:
    """What `cls` assigns or defines itself."""
    owned = _self_attributes(cls, (ast.Store, ast.Del))
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(n.name)
        elif isinstance(n, ast.Assign):
            owned |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and n.value is not None:
            owned.add(n.target.id)
    return owned


def _defined_by_kerastower() -> set[str]:
    names = set()
    for path in MODULES.values():
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef):
                names |= _owned(cls)
    return names


def undeclared_reads(source: str, module: str, ours: set[str]) -> list[str]:
    """``Class.self._x`` reads in `source` that the class does not own or declare."""
    classes = _classes(ast.parse(source))
    found = []
    for name, cls in classes.items():
        known = _owned(cls) | _declared(cls)
        for base in cls.bases:  # a base class of the same module
            if isinstance(base, ast.Name) and base.id in classes:
                known |= _owned(classes[base.id]) | _declared(classes[base.id])
        for attr in sorted(_self_attributes(cls, ast.Load)):
            if not _private(attr) or attr in known:
                continue
            if module.startswith(FENCE) and attr not in ours:
                continue  # Keras's own, read by the fence
            found.append(f"{name}.self.{attr}")
    return found


@pytest.fixture(scope="module")
def ours():
    return _defined_by_kerastower()


def test_parts_read_only_what_they_own_or_declare(ours):
    found = [
        f"{module}: {read}"
        for module, path in sorted(MODULES.items())
        for read in undeclared_reads(path.read_text(), module, ours)
    ]
    assert found == []


def test_the_declared_protocol_is_what_the_model_has():
    model = _classes(ast.parse(MODULES["kerastower.model"].read_text()))["TowerModel"]
    has = _owned(model) | {"num_towers"}  # a property of `TowerModel`
    declared = {}  # "module.Class": the names it declares
    for module, path in MODULES.items():
        for name, cls in _classes(ast.parse(path.read_text())).items():
            if name in PARTS:
                declared[f"{module}.{name}"] = _declared(cls)
    assert {key.rpartition(".")[2] for key in declared} == set(PARTS)
    assert declared["kerastower.entry_points.EntryPoints"] >= {"_tower_step"}
    missing = {key: names - has for key, names in declared.items() if names - has}
    assert missing == {}


READ = "    def f(self):\n        return self._step"


@pytest.mark.parametrize(
    "source, expected",
    [
        # Read from the host, undeclared: the mixins' old way.
        (f"class Part:\n{READ}", ["Part.self._step"]),
        (f"class Part:\n    _step: int\n{READ}", []),
        (f"class Part:\n    def g(self):\n        self._step = 1\n{READ}", []),
        (
            f"class Base:\n    def _step(self): ...\nclass Part(Base):\n{READ}",
            [],
        ),
    ],
)
def test_the_check_can_fail(source, expected):
    assert undeclared_reads(source, "kerastower.probe", {"_step"}) == expected
