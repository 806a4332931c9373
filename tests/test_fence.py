"""The Keras fence: mirrored families, one interface, no family flag outside.

`kerastower/_keras_compat/keras3/` and `keras2/` hold modules of the same
names whose ``__all__`` lists the same names; the fence's ``interface``
(which its ``__init__`` hands on, on TensorFlow) re-exports them; no module
outside the fence reads a capability flag (an upper-case name such as
``KERAS_FAMILY``) or a family's variable class. Read
from the source with `ast`, so that both families are checked whichever one
is installed.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kerastower"
FENCE = ROOT / "_keras_compat"
FAMILIES = ("keras3", "keras2")
# A family's own helper, not part of the interface: where Keras 2 keeps its
# private modules (Keras 3 has one place).
OWN_MODULES = {"keras2": {"internals"}}
# What a module outside the fence must not read from it, besides upper-case
# names: the class of a family's variables (ask `is_variable`).
FORBIDDEN = {"Variable"}


def exported(source: str) -> list[str] | None:
    """The literal ``__all__`` of a module's source, or ``None``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__"
            for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def defined(source: str) -> set[str]:
    """The names a module's top level defines (functions, classes, assigned
    names, tuple targets included)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def family_modules(family: str) -> dict[str, str]:
    """A family's interface modules: their name and source."""
    return {
        path.stem: path.read_text()
        for path in sorted((FENCE / family).glob("*.py"))
        if path.stem != "__init__" and path.stem not in OWN_MODULES.get(family, ())
    }


def parity_errors(families: dict[str, dict[str, str]]) -> list[str]:
    """What keeps the families from mirroring each other."""
    errors = []
    (first, modules), *others = families.items()
    for family, theirs in others:
        if set(theirs) != set(modules):
            errors.append(
                f"modules: {first} {sorted(modules)}, {family} {sorted(theirs)}"
            )
    for family, sources in families.items():
        for name, source in sources.items():
            names = exported(source)
            if names is None:
                errors.append(f"{family}.{name} has no literal __all__")
                continue
            if set(names) - defined(source):
                errors.append(
                    f"{family}.{name} lists undefined {set(names) - defined(source)}"
                )
            for other, theirs in others:
                if other == family or name not in theirs:
                    continue
                if set(names) != set(exported(theirs[name]) or ()):
                    errors.append(f"{family}.{name} != {other}.{name}")
    return errors


def flag_reads(source: str) -> list[str]:
    """Upper-case (or `FORBIDDEN`) names that a module reads from the fence:
    imported from it, or read as an attribute of a name bound to it."""
    bound, found = set(), []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "kerastower._keras_compat"
        ):
            for alias in node.names:
                if alias.name.isupper() or alias.name in FORBIDDEN:
                    found.append(alias.name)
                elif alias.name != "keras":  # the Keras in use: public API
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "kerastower":
            bound.update(
                a.asname or a.name for a in node.names if a.name == "_keras_compat"
            )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kerastower._keras_compat") and alias.asname:
                    bound.add(alias.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and (node.attr.isupper() or node.attr in FORBIDDEN)
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_families_mirror_each_other():
    families = {family: family_modules(family) for family in FAMILIES}
    assert len(families["keras3"]) >= 5
    assert parity_errors(families) == []


def test_the_fence_exports_the_family_interface():
    source = (FENCE / "interface.py").read_text()
    names = set(exported(source))
    assigned = defined(source)
    for module, module_source in family_modules("keras3").items():
        interface = set(exported(module_source))
        assert interface <= names, module
        assert interface <= assigned, module


def test_no_module_outside_the_fence_reads_a_family_flag():
    reads = {
        path.relative_to(ROOT).as_posix(): flag_reads(path.read_text())
        for path in ROOT.rglob("*.py")
        if FENCE not in path.parents
    }
    assert len(reads) > 60
    assert {path: names for path, names in reads.items() if names} == {}


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "from kerastower._keras_compat.family import KERAS_FAMILY, keras",
            ["KERAS_FAMILY"],
        ),
        (
            "from kerastower import _keras_compat\n_keras_compat.SUPPORTS_REPLICAS",
            ["_keras_compat.SUPPORTS_REPLICAS"],
        ),
        (
            "from kerastower._keras_compat import family\nfamily.Variable",
            ["family.Variable"],
        ),
        (
            "import kerastower._keras_compat as k\nk.RECORDS_ASSIGNMENTS",
            ["k.RECORDS_ASSIGNMENTS"],
        ),
        ("from kerastower import _keras_compat\n_keras_compat.track_step_loss", []),
        ("from other import FLAG\nother.FLAG", []),
        ("from kerastower._keras_compat.family import keras\nkeras.Variable", []),
    ],
)
def test_the_flag_check_can_fail(source, expected):
    assert flag_reads(source) == expected


def test_the_parity_check_can_fail():
    mirrored = {
        "keras3": {"layers": '__all__ = ["a"]\ndef a(): pass\n'},
        "keras2": {"layers": '__all__ = ["a"]\na = 1\n'},
    }
    assert parity_errors(mirrored) == []
    one_more = dict(mirrored, keras2={"layers": '__all__ = ["a", "b"]\na = b = 1\n'})
    assert parity_errors(one_more) == ["keras3.layers != keras2.layers"]
    undefined = dict(mirrored, keras2={"layers": '__all__ = ["a"]\n'})
    assert parity_errors(undefined) == ["keras2.layers lists undefined {'a'}"]
    missing = dict(mirrored, keras2={"losses": '__all__ = ["a"]\na = 1\n'})
    assert parity_errors(missing)[0].startswith("modules: keras3 ['layers']")
