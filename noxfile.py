"""The (Keras, TensorFlow) version matrix: ``nox`` installs each pair and tests it.

``nox -s matrix`` runs every supported pair; ``nox -s "matrix(keras='3.8.0',
tensorflow='2.16.2')"`` one of them; ``nox -s edges`` the oldest and newest
pair, which CI runs. Each session installs kerastower with the pair into a
fresh virtual environment and runs the equivalence, real-world exactness,
property and Keras-compatibility tests, then writes one row of
``bench/results/matrix.json`` (``python -m nox -s matrix`` and then
``python noxfile.py --table`` prints the Markdown table the docs show).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
RESULTS = ROOT / "bench" / "results" / "matrix.json"

KERAS = ["3.8.0", "3.9.2", "3.10.0", "3.11.3", "3.12.0", "3.13.2", "3.14.0", "3.15.1"]
TENSORFLOW = ["2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.20.0", "2.21.0"]
EDGES = [(KERAS[0], TENSORFLOW[0]), (KERAS[-1], TENSORFLOW[-1])]
SUITES = [
    "tests/test_equivalence.py",
    "tests/test_real_world_exactness.py",
    "tests/test_custom_fit_idioms.py",
    "tests/test_keras_compat.py",
    "tests/properties",
]

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["edges"]


def _test_pair(session: nox.Session, keras: str, tensorflow: str) -> None:
    # TensorFlow 2.16-2.17 need numpy < 2; pip resolves it from their pins.
    session.install(f"tensorflow-cpu=={tensorflow}", f"keras=={keras}")
    session.install("pytest>=8", "hypothesis>=6.100", "scikit-learn>=1.3")
    session.install("--no-deps", "-e", ".")
    start = time.time()
    outcome = "passed"
    try:
        session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES)
    except nox.command.CommandFailed:
        outcome = "failed"
        raise
    finally:
        _record(keras, tensorflow, outcome, time.time() - start)


def _record(keras: str, tensorflow: str, outcome: str, seconds: float) -> None:
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    rows = [r for r in rows if (r["keras"], r["tensorflow"]) != (keras, tensorflow)]
    rows.append(
        dict(
            keras=keras,
            tensorflow=tensorflow,
            outcome=outcome,
            seconds=round(seconds),
            date=time.strftime("%Y-%m-%d"),
        )
    )
    rows.sort(key=lambda r: (r["tensorflow"], r["keras"]))
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")


@nox.session
@nox.parametrize("tensorflow", TENSORFLOW)
@nox.parametrize("keras", KERAS)
def matrix(session: nox.Session, keras: str, tensorflow: str) -> None:
    """One (Keras, TensorFlow) pair of the supported range."""
    _test_pair(session, keras, tensorflow)


@nox.session
def edges(session: nox.Session) -> None:
    """The oldest and the newest supported pair."""
    for keras, tensorflow in EDGES:
        _test_pair(session, keras, tensorflow)


def table() -> str:
    """The last results as a Markdown table, TensorFlow down, Keras across."""
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    cells = {(r["keras"], r["tensorflow"]): r for r in rows}
    lines = [
        "| TensorFlow \\ Keras | " + " | ".join(KERAS) + " |",
        "|---" * (len(KERAS) + 1) + "|",
    ]
    for tensorflow in TENSORFLOW:
        marks = []
        for keras in KERAS:
            row = cells.get((keras, tensorflow))
            marks.append(
                "not run" if row is None else f"{row['outcome']} ({row['date']})"
            )
        lines.append(f"| {tensorflow} | " + " | ".join(marks) + " |")
    return "\n".join(lines)


if __name__ == "__main__" and "--table" in sys.argv:
    print(table())
