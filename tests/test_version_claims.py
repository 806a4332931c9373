"""The version claims of the pages agree with the ranges that noxfile.py declares.

``noxfile.py`` declares the supported ranges (``KERAS``, ``TENSORFLOW``,
``KERAS2``) and runs them; ``bench/results/matrix.json`` holds the last run
of each pair, which ``python noxfile.py --docs`` writes into
``docs/installation.md`` as its two tables. The noxfile is read with `ast`
(``bench/matrix_table.py``'s `declared`), not imported: nox need not be
installed where the tests run. These tests fail when

- README.md, docs/index.md, docs/installation.md or pyproject.toml state a
  Keras or TensorFlow range ("Keras 3.8 to 3.15", "`tf_keras` 2.16 to 2.21",
  ``keras>=3.8,<3.16``) outside the declared one, or leave out the one they
  must state;
- ``kerastower/_keras_compat/errors.py``'s ``SUPPORTED_*`` fence differs;
- the tables in docs/installation.md are not what the results render
  (run ``python noxfile.py --docs``), or a row does not say which suite ran.

A narrower range inside the declared one passes: the pages say what differs
between releases ("Keras 3.8 to 3.13 add an activity regularizer's loss as
the batch's sum").
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import matrix_table  # noqa: E402
from bench.matrix_table import key, legacy, minor  # noqa: E402

PAGES = ("README.md", "docs/index.md", "docs/installation.md", "pyproject.toml")
VERSION = r"\d+\.\d+(?:\.\d+)?"
# "Keras 3.8 to 3.15", "Keras 3 (3.8 to 3.15)", "[Keras 3](url) (3.8 to
# 3.15)", "TensorFlow\n2.16.2 to 2.21", "`tf_keras` 2.16 to 2.21", "Keras
# 2.12-2.21", and a table's "| Keras 3 | 3.8 to 3.15 |".
RANGE = re.compile(
    r"(?P<name>Keras(?:\s+[23](?!\.))?|TensorFlow|`?tf_keras`?)"
    r"(?:\]\([^)\s]*\))?(?:\s+\(?|\s*\|\s*)"
    rf"(?P<low>{VERSION})\s*(?:to|-|–)\s*(?P<high>{VERSION})(?![\d.]*\d)"
)
# "keras>=3.8,<3.16", "tensorflow[and-cuda]>=2.16.2,<2.22", "tf_keras>=...".
SPECIFIER = re.compile(
    r"(?<![\w-])(?P<name>keras|tf_keras|tensorflow(?:-cpu|\[and-cuda\])?)"
    rf"\s*(?P<spec>>=\s*{VERSION}\s*,\s*<\s*{VERSION})"
)


def _ranges(noxfile: dict) -> dict[str, tuple[str, str]]:
    """Each kind of Keras or TensorFlow -> its declared (lowest, highest)."""
    keras2 = list(noxfile["KERAS2"].values())
    tf_keras = [k for tf, k in noxfile["KERAS2"].items() if legacy(tf)]
    tf_dot_keras = [tf for tf in noxfile["KERAS2"] if not legacy(tf)]
    tensorflow = [*noxfile["KERAS2"], *noxfile["TENSORFLOW"]]
    return {
        "Keras 3": (minor(noxfile["KERAS"][0]), minor(noxfile["KERAS"][-1])),
        "TensorFlow with Keras 3": (
            noxfile["TENSORFLOW"][0],
            minor(noxfile["TENSORFLOW"][-1]),
        ),
        "Keras 2": (minor(keras2[0]), minor(keras2[-1])),
        "tf_keras": (minor(tf_keras[0]), minor(tf_keras[-1])),
        "TensorFlow with tf.keras": (minor(tf_dot_keras[0]), minor(tf_dot_keras[-1])),
        "TensorFlow": (
            minor(min(tensorflow, key=key)),
            minor(max(tensorflow, key=key)),
        ),
    }


def _specifiers(noxfile: dict) -> dict[str, str]:
    """Each requirement name -> the specifier of its declared range."""
    ranges = _ranges(noxfile)

    def spec(low, high):
        return f">={low},<{minor(high, 1)}"

    tensorflow = spec(*ranges["TensorFlow with Keras 3"])
    return {
        "keras": spec(*ranges["Keras 3"]),
        "tensorflow": tensorflow,
        "tensorflow-cpu": tensorflow,
        "tensorflow[and-cuda]": tensorflow,
        "tf_keras": spec(*ranges["tf_keras"]),
    }


# What each page must state, in the words RANGE finds: the kinds whose
# declared range appears there as it is declared.
REQUIRED = {
    "README.md": (
        "Keras 3",
        "TensorFlow with Keras 3",
        "Keras 2",
        "TensorFlow with tf.keras",
        "tf_keras",
    ),
    "docs/index.md": ("Keras 3", "TensorFlow with Keras 3", "Keras 2"),
    "docs/installation.md": (
        "Keras 3",
        "TensorFlow with Keras 3",
        "Keras 2",
        "TensorFlow with tf.keras",
        "tf_keras",
    ),
    "pyproject.toml": (),
}


def _kind(name: str, low: str) -> str:
    """Which bounds a stated range is held to."""
    name = name.strip("`")
    if low.startswith("3."):
        return "Keras 3"
    if name in ("TensorFlow", "Keras 3"):  # "| TensorFlow, with Keras 3 | 2.16.2"
        return "TensorFlow"
    return "tf_keras" if name == "tf_keras" else "Keras 2"


def stated(text: str) -> list[tuple[int, str, str, str]]:
    """(line, kind, lowest, highest) of each version range that `text` states."""
    return [
        (
            text.count("\n", 0, m.start()) + 1,
            _kind(m["name"], m["low"]),
            m["low"],
            m["high"],
        )
        for m in RANGE.finditer(text)
    ]


def disagreements(text: str, noxfile: dict, required=()) -> list[str]:
    """What in `text` disagrees with the ranges `noxfile` declares."""
    ranges = _ranges(noxfile)
    found = []
    said = set()
    for line, kind, low, high in stated(text):
        said.add((kind, low, high))
        lowest, highest = ranges[kind]
        inside = key(lowest) <= key(low) <= key(high)
        if not (inside and key(minor(high)) <= key(highest)):
            found.append(
                f"line {line}: {kind} {low} to {high} is outside the declared "
                f"{lowest} to {highest}"
            )
    for kind in required:
        if (kind.split(" with ")[0], *ranges[kind]) not in said:
            lowest, highest = ranges[kind]
            found.append(f"states no {kind} range {lowest} to {highest}")
    specifiers = _specifiers(noxfile)
    for m in SPECIFIER.finditer(text):
        if _JAX_EXTRA.match(text, text.rfind("\n", 0, m.start()) + 1):
            continue  # the JAX pair's (test_the_jax_range_is_the_declared_pair)
        spec = re.sub(r"\s", "", m["spec"])
        if spec != specifiers[m["name"]]:
            line = text.count("\n", 0, m.start()) + 1
            found.append(
                f"line {line}: {m['name']}{spec} is not the declared "
                f"{m['name']}{specifiers[m['name']]}"
            )
    return found


# pyproject.toml's `jax` extra: Keras 3 on JAX, held to `JAX_PAIR`.
_JAX_EXTRA = re.compile(r"jax = \[")


@pytest.fixture(scope="module")
def noxfile():
    return matrix_table.declared()


# The examples below hold the finder to fixed ranges, whatever noxfile.py
# declares today.
EXAMPLE = {
    "KERAS": ["3.8.0", "3.15.1"],
    "TENSORFLOW": ["2.16.2", "2.21.0"],
    "KERAS2": {
        "2.12.1": "2.12.0",
        "2.15.1": "2.15.0",
        "2.16.2": "2.16.0",
        "2.21.0": "2.21.0",
    },
}


@pytest.mark.parametrize(
    "text, what",
    [
        ("Keras 3.7 to 3.15 with TensorFlow 2.16.2 to 2.21", "Keras 3 3.7 to 3.15"),
        ("for Keras 3 (3.8 to 3.16)", "Keras 3 3.8 to 3.16"),
        ("| Keras 3 | 3.7 to 3.15 | 3.8.0 |", "Keras 3 3.7 to 3.15"),
        ("| TensorFlow, with Keras 3 | 2.11 to 2.21 |", "TensorFlow 2.11 to 2.21"),
        ("[Keras 3](https://keras.io/) (3.7 to 3.15)", "Keras 3 3.7 to 3.15"),
        ("TensorFlow\n2.11 to 2.21", "TensorFlow 2.11 to 2.21"),
        ("`tf_keras` 2.15 to 2.21", "tf_keras 2.15 to 2.21"),
        ("Keras 2 (2.11 to 2.21)", "Keras 2 2.11 to 2.21"),
        ('pip install "keras>=3.7,<3.16"', "keras>=3.7,<3.16"),
        ('cpu = ["tensorflow-cpu>=2.16.2,<2.21"]', "tensorflow-cpu>=2.16.2,<2.21"),
    ],
)
def test_a_range_outside_the_declared_one_is_found(text, what):
    found = disagreements(text, EXAMPLE)
    assert len(found) == 1 and what in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "Keras 3.8 to 3.15 with TensorFlow 2.16.2 to 2.21",
        "**Keras 3.8 to 3.13** add an activity regularizer's loss",
        "beside a TensorFlow 2.16 to 2.19 that came with a Keras 3 older than 3.8",
        "Keras 2 (2.12 to 2.21), the `tf.keras` of TensorFlow 2.12 to 2.15",
        'legacy = ["tf_keras>=2.16,<2.22"]  # tf_keras~=2.18.0 beside 2.18',
        "1.9 to 2.6 times the plain model's, Python 3.11 or newer",
    ],
)
def test_a_range_inside_the_declared_one_passes(text):
    assert disagreements(text, EXAMPLE) == []


def test_a_page_that_leaves_out_its_range_fails():
    found = disagreements("Keras 3.8 to 3.14", EXAMPLE, ["Keras 3"])
    assert found == ["states no Keras 3 range 3.8 to 3.15"]


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_state_the_declared_ranges(page, noxfile):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert stated(text) or page == "pyproject.toml", f"{page} states no range"
    found = disagreements(text, noxfile, REQUIRED[page])
    assert not found, (
        f"{page} disagrees with the ranges noxfile.py declares (KERAS, "
        "TENSORFLOW, KERAS2):\n" + "\n".join(found)
    )


def test_the_fence_is_the_declared_range(noxfile):
    """``import kerastower`` accepts what the matrix declares, no more."""
    errors = (ROOT / "kerastower" / "_keras_compat" / "errors.py").read_text()
    fence = dict(re.findall(r'^(SUPPORTED_\w+) = "(.*)"$', errors, re.M))
    ranges = _ranges(noxfile)
    specifiers = _specifiers(noxfile)
    keras_2 = ranges["Keras 2"]
    tensorflow_2 = [minor(tf) for tf in noxfile["KERAS2"]]
    assert fence == {
        "SUPPORTED_KERAS": specifiers["keras"],
        "SUPPORTED_TENSORFLOW": specifiers["tensorflow"],
        "SUPPORTED_KERAS_2": f">={keras_2[0]},<{minor(keras_2[1], 1)}",
        "SUPPORTED_TENSORFLOW_2": (
            f">={tensorflow_2[0]},<{minor(tensorflow_2[-1], 1)}"
        ),
    }


def test_the_jax_range_is_the_declared_pair(noxfile):
    """The `jax` extra and the JAX fence start at the pair `nox -s jax` runs."""
    pair = noxfile["JAX_PAIR"]
    extra = re.search(r"^jax = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert extra, "pyproject.toml has no `jax` extra"
    requirements = dict(
        re.fullmatch(r'"(keras|jax)(>=.*)"', r.strip()).groups()
        for r in extra.group(1).split(", ")
    )
    fence = (ROOT / "kerastower" / "_keras_compat" / "jax" / "__init__.py").read_text()
    supported = dict(re.findall(r'^SUPPORTED_(KERAS|JAX) = "(.*)"$', fence, re.M))
    assert requirements == {
        "keras": supported["KERAS"],
        "jax": supported["JAX"],
    }
    assert requirements["keras"].startswith(f">={minor(pair['keras'])},")
    assert requirements["jax"].startswith(f">={minor(pair['jax'])},")


def test_the_supported_versions_table_names_the_tested_releases(noxfile):
    """The installation page's "Tested" column lists the matrix's releases."""
    text = (ROOT / "docs" / "installation.md").read_text(encoding="utf-8")
    section = text.split("## Supported versions", 1)[1].split("\n\n", 2)[1]

    def listed(versions):
        return ", ".join(versions[:-1]) + " and " + versions[-1]

    assert f"| {listed(noxfile['KERAS'])}" in section, section
    assert f"| {listed(noxfile['TENSORFLOW'])}" in section, section
    assert "(#tested-versions)" in section


def test_pyproject_points_at_the_table_instead_of_restating_it():
    text = (ROOT / "pyproject.toml").read_text()
    assert "docs/installation.md#tested-versions" in text
    assert "ran green" not in text


def test_the_tables_are_the_matrix_results(noxfile):
    """docs/installation.md shows what ``python noxfile.py --docs`` writes."""
    page = matrix_table.blocks((ROOT / "docs" / "installation.md").read_text())
    expected = matrix_table.rendered(matrix_table.load(), noxfile)
    for name in expected:
        assert page[name] == expected[name], (
            f"the <!-- {name} --> table of docs/installation.md is not "
            "bench/results/matrix.json's: run `python noxfile.py --docs`"
        )


def test_every_row_says_which_suite_ran():
    """A row's ``suites``: its test paths, or None where nobody recorded them."""
    rows = matrix_table.load()
    assert rows
    for row in rows.values():
        assert "suites" in row, row
        assert row["suites"] is None or (
            row["suites"] and all(p.startswith("tests/") for p in row["suites"])
        ), row
    text = (ROOT / "docs" / "installation.md").read_text(encoding="utf-8")
    for body in matrix_table.blocks(text).values():
        cells = re.findall(r"(?<=\| )(?:passed|failed) [^|]*(?= \|)", body)
        assert cells
        for cell in cells:
            assert re.search(r", (suite [A-Z]|suite not recorded)$", cell), cell


def test_the_noxfile_renders_the_same_tables(noxfile):
    """With nox installed, the noxfile's own `table` is the one checked here."""
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cells = matrix_table.load()
    assert module.table() == matrix_table.table(cells, noxfile)
    assert module.table_keras2() == matrix_table.table_keras2(cells, noxfile)
