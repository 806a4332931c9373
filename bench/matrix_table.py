"""The version matrix's last results as the tables of the installation page.

``noxfile.py`` declares the supported (Keras, TensorFlow) ranges, runs each
pair and records one row per pair in ``bench/results/matrix.json``, with the
test paths it gave pytest (``suites``). This module renders those rows as
the Markdown tables between the ``<!-- matrix:start/end -->`` and
``<!-- matrix-keras2:start/end -->`` markers of ``docs/installation.md``
(``python noxfile.py --docs`` writes them). It needs neither nox nor
TensorFlow: `declared` reads the noxfile's ranges with `ast`, so that
``tests/test_version_claims.py`` renders the tables as the noxfile does and
compares them with the page.

Each cell names the suite its run ran, as a letter (``suite A``) that a
legend under the table spells out. Rows recorded before ``suites`` existed
carry it backfilled (``suites_backfilled``): the ``SUITES`` or
``KERAS2_SUITES`` of ``git show <commit>:noxfile.py`` for the row's commit,
or null where that noxfile had none; such a cell says ``suite not
recorded``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "matrix.json"
DOCS = ROOT / "docs" / "installation.md"
NOXFILE = ROOT / "noxfile.py"

# What noxfile.py declares the matrix with: literals, read by `declared`.
DECLARED = (
    "KERAS",
    "TENSORFLOW",
    "TENSORFLOW_NEEDS_KERAS",
    "KERAS2",
    "SUITES",
    "KERAS2_SUITES",
    "JAX_PAIR",
)
NOT_RECORDED = "suite not recorded"


def declared(noxfile: Path = NOXFILE) -> dict:
    """The `DECLARED` constants of `noxfile`, parsed, not imported."""
    values = {}
    for node in ast.parse(noxfile.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in DECLARED
        ):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    missing = [name for name in DECLARED if name not in values]
    if missing:
        raise ValueError(f"{noxfile} declares no literal {', '.join(missing)}")
    return values


def key(version: str) -> tuple[int, ...]:
    """``"3.15.1"`` -> ``(3, 15, 1)``."""
    return tuple(int(part) for part in version.split("."))


def minor(version: str, step: int = 0) -> str:
    """``"3.15.1"`` -> ``"3.15"``; with `step` 1, ``"3.16"``."""
    major, number = key(version)[:2]
    return f"{major}.{number + step}"


def legacy(tensorflow: str) -> bool:
    """Whether a Keras 2 pair's Keras is `tf_keras` (TensorFlow 2.16 on)."""
    return key(tensorflow) >= (2, 16)


def keras2_requirements(tensorflow: str, keras: str) -> list[str]:
    """What pip installs for `tensorflow`'s Keras 2 pair."""
    if legacy(tensorflow):
        # tf_keras requires the `tensorflow` distribution; with
        # `tensorflow-cpu` pip would install both, one over the other.
        return [f"tensorflow=={tensorflow}", f"tf_keras=={keras}"]
    return [f"tensorflow-cpu=={tensorflow}", f"keras=={keras}"]


def installable(keras: str, tensorflow: str, needs_keras: dict[str, str]) -> bool:
    """Whether pip can install the pair (TensorFlow's own Keras requirement)."""
    return key(keras) >= key(needs_keras.get(tensorflow, "0"))


def load(results: Path = RESULTS) -> dict[tuple[str, str], dict]:
    """The recorded rows, by (Keras, TensorFlow)."""
    rows = json.loads(results.read_text()) if results.exists() else []
    return {(r["keras"], r["tensorflow"]): r for r in rows}


def suite(row: dict) -> tuple[str, ...] | None:
    """The test paths a row ran, sorted; None where they were not recorded."""
    paths = row.get("suites")
    return tuple(sorted(paths)) if paths else None


def suite_labels(*tables: list[dict]) -> dict[tuple[str, ...], str]:
    """A letter per suite, in the order of the tables, then of first run."""
    labels: dict[tuple[str, ...], str] = {}
    for rows in tables:
        first: dict[tuple[str, ...], str] = {}
        for row in rows:
            paths = suite(row)
            if paths is not None:
                first[paths] = min(first.get(paths, row["date"]), row["date"])
        for paths in sorted(first, key=lambda p: (first[p], p)):
            labels.setdefault(paths, chr(ord("A") + len(labels)))
    return labels


def mark(row: dict | None, labels: dict[tuple[str, ...], str]) -> str:
    """One cell: the outcome, tests passed of those run, seconds, suite."""
    if row is None:
        return "not run"
    skipped = row.get("skipped", 0) + row.get("other_family", 0)
    passed = row["tests"] - row["failures"] - row["errors"] - skipped
    text = f"{row['outcome']} {passed}/{row['tests']}"
    if skipped:  # mostly what the other Keras family has (noxfile's FAMILY_SKIPS)
        text += f" ({skipped} skipped)"
    paths = suite(row)
    name = NOT_RECORDED if paths is None else f"suite {labels[paths]}"
    return f"{text}, {row['seconds']} s, {name}"


def _caption(run: list[dict], what: str) -> list[str]:
    """When and on which Python the `run` rows ran, and how long."""
    if not run:
        return []
    dates = sorted({r["date"] for r in run})
    # The commits stay in bench/results/matrix.json; the page gives the dates.
    return [
        "",
        f"Run {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") + ", Python "
        f"{', '.join(sorted({r['python'] for r in run}))}{what}; "
        f"{sum(r['seconds'] for r in run) // 60} minutes of tests in all.",
    ]


def _legend(
    run: list[dict],
    labels: dict[tuple[str, ...], str],
    current: list[str],
    name: str,
) -> list[str]:
    """Each suite of the `run` rows: its letter and its test paths."""
    used = {suite(r) for r in run}
    lines = ["", "Each cell's suite, the test paths its run gave pytest:", ""]
    for paths, label in labels.items():
        if paths in used:
            now = (
                f" (`{name}` in `noxfile.py`)"
                if paths == tuple(sorted(current))
                else ""
            )
            lines.append(
                f"- suite {label}{now}: " + ", ".join(f"`{p}`" for p in paths) + "."
            )
    if None in used:
        lines.append(
            f"- {NOT_RECORDED}: neither the row nor the `noxfile.py` of its "
            "commit says which test paths its run gave pytest."
        )
    return lines if len(lines) > 3 else []


def _runs(cells: dict, declared: dict) -> tuple[list[dict], list[dict]]:
    """The Keras 3 and the Keras 2 rows that the tables show."""
    keras3 = [
        cells[k]
        for k in cells
        if k[0] in declared["KERAS"] and k[1] in declared["TENSORFLOW"]
    ]
    keras2 = [
        cells[(k, tf)] for tf, k in declared["KERAS2"].items() if (k, tf) in cells
    ]
    return keras3, keras2


def table(cells: dict, declared: dict) -> str:
    """The last Keras 3 run as a Markdown table, TensorFlow down, Keras across."""
    keras, tensorflow = declared["KERAS"], declared["TENSORFLOW"]
    labels = suite_labels(*_runs(cells, declared))
    lines = [
        "| TensorFlow \\ Keras | " + " | ".join(keras) + " |",
        "|---" * (len(keras) + 1) + "|",
    ]
    for tf in tensorflow:
        marks = [
            mark(cells.get((k, tf)), labels)
            if installable(k, tf, declared["TENSORFLOW_NEEDS_KERAS"])
            else "not installable"
            for k in keras
        ]
        lines.append(f"| {tf} | " + " | ".join(marks) + " |")
    run = _runs(cells, declared)[0]
    return "\n".join(
        lines
        + _caption(run, ", tensorflow-cpu")
        + _legend(run, labels, declared["SUITES"], "SUITES")
    )


def table_keras2(cells: dict, declared: dict) -> str:
    """The last Keras 2 run as a Markdown table, one pair a line."""
    labels = suite_labels(*_runs(cells, declared))
    lines = [
        "| TensorFlow | Keras 2 | Installed with | Tests |",
        "|---|---|---|---|",
    ]
    for tensorflow, keras in declared["KERAS2"].items():
        family = (
            f"`tf_keras` {keras}, `TF_USE_LEGACY_KERAS=1`"
            if legacy(tensorflow)
            else f"`keras` {keras}, as `tf.keras`"
        )
        requirements = " ".join(keras2_requirements(tensorflow, keras))
        lines.append(
            f"| {tensorflow} | {family} | `{requirements}` "
            f"| {mark(cells.get((keras, tensorflow)), labels)} |"
        )
    run = _runs(cells, declared)[1]
    return "\n".join(
        lines
        + _caption(run, "")
        + _legend(run, labels, declared["KERAS2_SUITES"], "KERAS2_SUITES")
    )


# The generated blocks of docs/installation.md: marker name -> its table.
TABLES: dict[str, Callable[[dict, dict], str]] = {
    "matrix": table,
    "matrix-keras2": table_keras2,
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)


def blocks(text: str) -> dict[str, str]:
    """What stands between each table's markers in `text`, by marker name."""
    found = {}
    for name in TABLES:
        match = _block(name).search(text)
        if match is None:
            raise ValueError(f"no <!-- {name}:start/end --> markers")
        found[name] = match[2]
    return found


def rendered(cells: dict, declared: dict) -> dict[str, str]:
    """Each table as `write_docs` writes it between its markers."""
    return {name: make(cells, declared) + "\n" for name, make in TABLES.items()}


def write_docs(declared: dict, results: Path = RESULTS, docs: Path = DOCS) -> None:
    """Replaces each table between its markers in ``docs/installation.md``."""
    text = docs.read_text()
    blocks(text)  # every marker is there
    for name, body in rendered(load(results), declared).items():
        text = _block(name).sub(lambda m, body=body: m[1] + body + m[3], text)
    docs.write_text(text)
