"""Docs and docstrings name only what the API reference documents.

A reader who meets `kerastower.step.batch_norm` in a docstring, or
``[...][kerastower.workers.slurm.slurm_task]`` on a page, finds no page for
it: the internal modules are not the API. Every ``kerastower.<dotted>`` name on
a docs page or in a docstring that the API pages render, and every backticked
``step.x``, ``reduce.x``, ``slurm.x`` or ``_keras_compat`` (the internal
modules by their short names), must be an object of the API pages, under a
public path. The site is built once, strictly, to read which objects the API
pages render.
"""

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kerastower
import kerastower.workers

pytest.importorskip("mkdocs")
griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[1]
# Pages about the code itself, not its API: the architecture page names the
# internal modules on purpose, and the changelog the names as they were.
ABOUT_THE_CODE = {"docs/architecture.md", "docs/changelog.md"}
# Pages edited elsewhere that still name internal modules, each with the name.
# An entry that no longer occurs fails the test, so that it leaves this list.
PENDING: set[tuple[str, str]] = set()
# Modules whose short names are also everyday variable names (`model.fit`,
# `strategy.scope`, `data.shape`): only their dotted `kerastower.` form counts.
AMBIGUOUS = {"model", "strategy", "data"}
DOTTED = re.compile(r"(?<![\w/.-])kerastower(?:\.[A-Za-z_]\w*)+")
# A program's output, quoted as it prints (a traceback names the module of an
# exception): not a reference.
OUTPUT = re.compile(r"^(\s*)```text\n.*?^\1```", re.M | re.S)


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """The ids of the objects that the API pages render."""
    out = tmp_path_factory.mktemp("site")
    # Not `-q`: it silences the warnings that `--strict` turns into a failure.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ids = set()
    for page in (out / "api").glob("*/index.html"):
        ids |= set(re.findall(r'id="(kerastower(?:\.[\w.]+)?)"', page.read_text()))
    return ids


@pytest.fixture(scope="module")
def package():
    return griffe.load("kerastower", search_paths=[str(ROOT)])


def _short_names(public):
    """The internal modules' short names, each with its dotted path.

    ``step``, ``reduce``, ... of the top level, and the workers wing's
    (``slurm`` is ``kerastower.workers.slurm``).
    """
    paths = {}
    for package in (kerastower, kerastower.workers):
        for module in pkgutil.iter_modules(package.__path__):
            paths.setdefault(module.name, f"{package.__name__}.{module.name}")
    public_names = {m.rpartition(".")[2] for m in public} | AMBIGUOUS
    return {name: path for name, path in paths.items() if name not in public_names}


def references(text, short_names):
    """The kerastower objects that `text` names, as ``kerastower.`` paths."""
    text = OUTPUT.sub("", text)
    found = [m.group(0) for m in DOTTED.finditer(text)]
    prefixes = "|".join(sorted(short_names))
    short = re.compile(rf"`((?:{prefixes})(?:\.[A-Za-z_]\w*)*)")
    for match in short.finditer(text):
        name = match.group(1)
        if "." in name or name.startswith("_"):
            module, dot, rest = name.partition(".")
            found.append(short_names[module] + dot + rest)
    return found


def _final(obj):
    """The object that a griffe alias (an import) stands for, or `obj`."""
    return obj.final_target if obj.is_alias else obj


class _Reference:
    """Whether a ``kerastower.`` path is an object that the API pages render."""

    def __init__(self, ids, package):
        self.ids, self.package = ids, package
        objects = {i: self.object(i) for i in ids}
        objects = {i: _final(o) for i, o in objects.items() if o is not None}
        self.modules = {i for i, o in objects.items() if o.is_module}
        self.targets = {o.path for o in objects.values()}

    def object(self, path):
        """The griffe object at a ``kerastower.`` path, or ``None``."""
        if path == "kerastower":
            return self.package
        try:
            return self.package[path.removeprefix("kerastower.")]
        except KeyError:
            return None

    def documented(self, ref):
        if ref in self.ids:
            return True
        # A public module's re-export, documented where it is defined
        # (`kerastower.is_chief` as `kerastower.cluster.is_chief`).
        parent, _, name = ref.rpartition(".")
        module = self.object(parent) if parent in self.modules else None
        if module is None or name not in module.members:
            return False
        exports = module.exports
        if exports is None:
            public = not name.startswith("_")
        else:
            public = name in [str(e) for e in exports]
        return public and _final(module.members[name]).path in self.targets


def _undocumented(ids, package):
    """Each (where, name) that names an object the API pages do not render."""
    check = _Reference(ids, package)
    short = _short_names(check.modules)
    found = set()
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    for path in pages:
        where = path.relative_to(ROOT).as_posix()
        if where not in ABOUT_THE_CODE:
            for ref in references(path.read_text(encoding="utf-8"), short):
                if not check.documented(ref):
                    found.add((where, ref))
    for anchor in sorted(ids):
        obj = check.object(anchor)
        if obj is None:
            continue
        obj = _final(obj)
        docstrings = [obj.docstring]
        if obj.is_class and "__init__" in obj.members:
            docstrings.append(obj.members["__init__"].docstring)
        for docstring in filter(None, docstrings):
            for ref in references(docstring.value, short):
                if not check.documented(ref):
                    found.add((anchor, ref))
    return found


def test_docs_and_docstrings_name_only_documented_objects(documented, package):
    found = _undocumented(documented, package)
    new = sorted(found - PENDING)
    assert not new, "names without an API page entry:\n" + "\n".join(
        f"{where}: {ref}" for where, ref in new
    )
    gone = sorted(PENDING - found)
    assert not gone, f"rewritten, take them out of PENDING: {gone}"


def test_the_check_finds_internal_names(documented, package):
    check = _Reference(documented, package)
    short = _short_names(check.modules)
    text = (
        "```text\nkerastower._keras_compat.errors.KerasCompatibilityError: ...\n```\n"
        "See `kerastower.step.batch_norm`, `reduce.replicas`, `_keras_compat`, "
        "[the task][kerastower.workers.slurm.slurm_task], kerastower.launch.LOGICAL, "
        "`kerastower.model.TowerModel` and `kerastower.workers.configs`; "
        "`heartbeats.describe`, `kerastower.cluster.shard`, "
        "[`tf_config_for`][kerastower.launch.tf_config_for], `kerastower.is_chief`, "
        "`kerastower.TowerModel.from_model`, `model.fit` and api/kerastower.md."
    )
    refs = references(text, short)
    assert [r for r in refs if not check.documented(r)] == [
        "kerastower.step.batch_norm",
        "kerastower.workers.slurm.slurm_task",
        "kerastower.launch.LOGICAL",
        "kerastower.model.TowerModel",
        "kerastower.workers.configs",
        "kerastower.reduce.replicas",
        "kerastower._keras_compat",
        "kerastower.workers.heartbeats.describe",
    ]
    assert len(refs) == 12


def _options_missing_from_usage(help_text):
    """The options of a ``--help`` whose every form its usage lines leave out."""
    usage, options = help_text.split("\n\n", 1)[0], help_text.split("options:\n")[1]
    in_usage = set(re.findall(r"(?<![\w-])--?\w[\w-]*", usage))
    missing = []
    for line in options.splitlines():
        if re.match(r"  -", line):  # an option, not its help's next line
            forms = re.findall(r"(?<![\w-])--?\w[\w-]*", re.split(r"\s{2,}", line)[1])
            if not in_usage & set(forms):
                missing.append(forms)
    return missing


def test_the_usage_check_finds_a_missing_option():
    help_text = (
        "usage: kerastower launch [-h] -n N [-m] script\n\noptions:\n"
        "  -h, --help            show this help message and exit\n"
        "  -n N, --num-workers N\n"
        "                        workers to start, see --evaluator\n"
        "  --evaluator           start one more process\n"
        "  -m, --module          run a module, as python -m\n"
    )
    assert _options_missing_from_usage(help_text) == [["--evaluator"]]


def test_the_launch_pages_usage_is_the_parsers():
    help_text = subprocess.run(
        [sys.executable, "-m", "kerastower", "launch", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    usage = help_text.split("\n\n", 1)[0]
    page = (ROOT / "docs" / "api" / "launch.md").read_text(encoding="utf-8")
    shown = re.search(r"```text\n(usage: kerastower launch.*?)\n```", page, re.S)
    assert shown and shown.group(1) == usage, (
        f"docs/api/launch.md's usage block must read, as `kerastower launch "
        f"--help` prints it:\n{usage}"
    )
    missing = _options_missing_from_usage(help_text)
    assert not missing, f"options missing from the usage: {missing}"
