"""The (Keras, TensorFlow) version matrix: ``nox`` installs each pair and tests it.

``KERAS`` and ``TENSORFLOW`` are the supported range that ``pyproject.toml``
declares, and every pair of them is run:

- ``nox -s matrix`` runs the whole matrix, one session per TensorFlow
  version; ``nox -s "matrix(tensorflow='2.16.2')"`` one row of it, and
  ``nox -s "matrix(tensorflow='2.16.2')" -- 3.14.0`` one pair. A session
  installs TensorFlow once, then each Keras in turn, runs `SUITES` on each
  pair and writes one row per pair to ``bench/results/matrix.json``; it fails
  when any pair fails, after running the others.
- ``nox -s oldest`` runs `CI_SUITES` on the oldest pair; ``.ci/run`` runs it
  (the newest pair is what CI's own interpreter tests).
- ``nox -s replicas`` runs the whole test suite and Keras's own model and
  trainer tests (``tests/keras_suite/run.py``) on the newest pair with the
  GPU path forced on logical CPUs (``KERASTOWER_REPLICATE_VARIABLES=1``:
  per-tower replicas, ring all-reduce); CI runs the equivalence and
  property tests that way.
- ``nox -s package`` builds the sdist and the wheel, checks them with
  ``twine check --strict``, and installs the wheel the ways the installation
  page gives: with the ``cpu`` extra into an empty virtual environment, and
  without an extra into one that already has TensorFlow (which must stay as
  it was). Each ends in ``kerastower demo --epochs 1``.

``python noxfile.py --table`` prints the last results as the Markdown table
that ``docs/installation.md`` shows, and ``python noxfile.py --docs`` writes
it there. Keras's own test modules (``tests/keras_suite/run.py``, 12 to 14
minutes a pair) are not part of a pair's run: of the Keras source releases
from 3.8.0 to 3.15.1 only 3.15.1's holds them, and CI runs them on the newest
pair.
"""

from __future__ import annotations

import ast
import fcntl
import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

ROOT = Path(__file__).parent
RESULTS = ROOT / "bench" / "results" / "matrix.json"
DOCS = ROOT / "docs" / "installation.md"

KERAS = ["3.8.0", "3.9.2", "3.10.0", "3.11.3", "3.12.4", "3.13.2", "3.14.0", "3.15.1"]
TENSORFLOW = ["2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.20.0", "2.21.0"]
# The oldest Keras a TensorFlow release requires, where it is in our range:
# pip cannot install the pairs below it.
TENSORFLOW_NEEDS_KERAS = {"2.20.0": "3.10.0", "2.21.0": "3.12.0"}
SUITES = [
    "tests/test_equivalence.py",
    "tests/test_real_world_exactness.py",
    "tests/test_custom_fit_idioms.py",
    "tests/test_keras_compat.py",
    "tests/properties",
]
# What CI runs on the oldest pair, in about five minutes with the install: the
# tests marked `core`, collected from their own files only (`CORE` in
# tests/conftest.py: equivalence, Keras compatibility and the property
# tests), so that no other module's skip (a missing docs tool) counts.
_CORE = re.search(
    r"^CORE = (\(.*?\))$", (ROOT / "tests" / "conftest.py").read_text(), re.M | re.S
)
CI_SUITES = ["-m", "core", *ast.literal_eval(_CORE.group(1))]
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis>=6.100", "scikit-learn>=1.3"]

nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.error_on_external_run = True
nox.options.sessions = ["oldest"]

# Reads the installed versions as the tests will import them.
_VERSIONS = (
    "import sys, keras, tensorflow as tf; "
    "print(keras.__version__, tf.__version__, '%d.%d' % sys.version_info[:2])"
)


def _declared_range(session: nox.Session) -> None:
    """Fails unless ``pyproject.toml`` declares exactly `KERAS` x `TENSORFLOW`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def minor(version: str, step: int = 0) -> str:
        major, minor = _key(version)[:2]
        return f"{major}.{minor + step}"

    expected = {
        f"keras>={minor(KERAS[0])},<{minor(KERAS[-1], 1)}": project["dependencies"],
        f"tensorflow-cpu>={TENSORFLOW[0]},<{minor(TENSORFLOW[-1], 1)}": project[
            "optional-dependencies"
        ]["cpu"],
        f"tensorflow[and-cuda]>={TENSORFLOW[0]},<{minor(TENSORFLOW[-1], 1)}": project[
            "optional-dependencies"
        ]["gpu"],
    }
    for requirement, declared in expected.items():
        if requirement not in declared:
            session.error(
                f"pyproject.toml must declare the matrix's range {requirement!r}. "
                f"Received: {declared}"
            )


def _install(session: nox.Session, tensorflow: str, keras: str) -> None:
    _declared_range(session)
    # TensorFlow 2.16 and 2.17 need numpy 1, 2.18 and 2.19 numpy < 2.2: pip
    # resolves it from their pins.
    session.install(f"tensorflow-cpu=={tensorflow}", f"keras=={keras}")
    session.install(*TEST_REQUIREMENTS)
    session.install("--no-deps", "-e", ".")


def _check_versions(session: nox.Session, keras: str, tensorflow: str) -> str:
    """Checks the pair the tests will import; returns the Python version."""
    out = session.run("python", "-c", _VERSIONS, silent=True, env=_ENV)
    *installed, python = out.split()[-3:]
    if installed != [keras, tensorflow]:
        session.error(
            f"asked for Keras {keras} and TensorFlow {tensorflow}; the session's "
            f"interpreter imports Keras {installed[0]} and TensorFlow {installed[1]}"
        )
    return python


_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}


def _test_pair(
    session: nox.Session, keras: str, tensorflow: str, suites: list[str]
) -> dict:
    """Runs `suites` on the installed pair; returns its row of the matrix."""
    python = _check_versions(session, keras, tensorflow)
    junit = Path(session.create_tmp()) / f"keras-{keras}.xml"
    start = time.time()
    try:
        session.run(
            "python",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rfEs",
            f"--junitxml={junit}",
            *suites,
            env=_ENV,
        )
        outcome = "passed"
    except nox.command.CommandFailed:
        outcome = "failed"
    counts = _counts(junit)
    if outcome == "passed" and (counts["tests"] == 0 or counts["skipped"]):
        outcome = "failed"  # a pair that ran nothing, or skipped a test, is not green
        session.warn(f"Keras {keras}, TensorFlow {tensorflow}: {counts}")
    return dict(
        keras=keras,
        tensorflow=tensorflow,
        python=python,
        outcome=outcome,
        **counts,
        seconds=round(time.time() - start),
        commit=_commit(),
        date=time.strftime("%Y-%m-%d"),
    )


def _counts(junit: Path) -> dict[str, int]:
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    if junit.exists():
        for suite in ET.parse(junit).iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    return counts


def _commit() -> str:
    """The commit of the package and tests that ran, ``+dirty`` if edited."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "kerastower", "tests"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "") if head else "unknown"


def _record(row: dict) -> None:
    # Sessions may run side by side (one TensorFlow per shell), each
    # rewriting the file: they take turns by locking this noxfile.
    with open(__file__) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        key = (row["keras"], row["tensorflow"])
        rows = [r for r in rows if (r["keras"], r["tensorflow"]) != key]
        rows.append(row)
        rows.sort(key=lambda r: (_key(r["tensorflow"]), _key(r["keras"])))
        RESULTS.write_text(json.dumps(rows, indent=1) + "\n")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def installable(keras: str, tensorflow: str) -> bool:
    """Whether pip can install the pair (TensorFlow's own Keras requirement)."""
    return _key(keras) >= _key(TENSORFLOW_NEEDS_KERAS.get(tensorflow, "0"))


@nox.session
@nox.parametrize("tensorflow", TENSORFLOW)
def matrix(session: nox.Session, tensorflow: str) -> None:
    """Every supported Keras (or those given after ``--``) on one TensorFlow."""
    kerases = session.posargs or KERAS
    unknown = [k for k in kerases if k not in KERAS]
    if unknown:
        session.error(f"Keras {unknown} is not in the supported range {KERAS}")
    failed = []
    for keras in kerases:
        if not installable(keras, tensorflow):
            session.log(f"Keras {keras}: TensorFlow {tensorflow} requires newer")
            continue
        start = time.time()
        _install(session, tensorflow, keras)
        session.log(f"Keras {keras}: installed in {time.time() - start:.0f} s")
        row = _test_pair(session, keras, tensorflow, SUITES)
        _record(row)
        if row["outcome"] != "passed":
            failed.append(keras)
    if failed:
        session.error(f"TensorFlow {tensorflow} fails with Keras {failed}")


@nox.session
def oldest(session: nox.Session) -> None:
    """`CI_SUITES` on the oldest supported pair (not recorded in the matrix)."""
    keras, tensorflow = KERAS[0], TENSORFLOW[0]
    start = time.time()
    _install(session, tensorflow, keras)
    session.log(f"installed in {time.time() - start:.0f} s")
    row = _test_pair(session, keras, tensorflow, CI_SUITES)
    session.log(f"{row}")
    if row["outcome"] != "passed":
        session.error(f"Keras {keras} with TensorFlow {tensorflow} fails")


@nox.session
def replicas(session: nox.Session) -> None:
    """Every test, and Keras's peer suite, with replicas forced on (newest pair)."""
    keras, tensorflow = KERAS[-1], TENSORFLOW[-1]
    # The development extras too: the docs and benchmark tests need them.
    session.install(f"tensorflow-cpu=={tensorflow}", f"keras=={keras}", "-e", ".[dev]")
    _check_versions(session, keras, tensorflow)
    env = {**_ENV, "KERASTOWER_REPLICATE_VARIABLES": "1"}
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", env=env)
    session.run("python", "tests/keras_suite/run.py", env=env)


def _venv(session: nox.Session, path: Path, *requirements: str) -> Path:
    """A fresh virtual environment at `path` with `requirements`; its ``bin``."""
    shutil.rmtree(path, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(path), external=True)
    bin_dir = path / "bin"
    if requirements:
        session.run(bin_dir / "pip", "install", "-q", *requirements, external=True)
    return bin_dir


def _tensorflow_packages(session: nox.Session, bin_dir: Path) -> list[str]:
    frozen = session.run(bin_dir / "pip", "freeze", silent=True, external=True)
    return sorted(line for line in frozen.split() if line.startswith("tensorflow"))


def _demo(session: nox.Session, bin_dir: Path) -> None:
    session.run(bin_dir / "kerastower", "--version", external=True, env=_ENV)
    session.run(bin_dir / "kerastower", "demo", "--epochs", "1", external=True)


@nox.session
def package(session: nox.Session) -> None:
    """Builds, checks and installs the wheel along the installation page's paths."""
    session.install("build>=1", "twine>=5")
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT))
    sdists, wheels = list(dist.glob("*.tar.gz")), list(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        session.error(f"expected one sdist and one wheel. Received: {sdists + wheels}")
    session.run("twine", "check", "--strict", str(sdists[0]), str(wheels[0]))
    wheel = wheels[0]

    # CPU only: nothing installed before; the extra brings TensorFlow.
    cpu = _venv(session, tmp / "cpu", f"{wheel}[cpu]")
    _demo(session, cpu)

    # TensorFlow already installed, older than the one the `cpu` extra would
    # bring: the wheel without an extra keeps it.
    existing = _venv(session, tmp / "existing", f"tensorflow-cpu=={TENSORFLOW[0]}")
    before = _tensorflow_packages(session, existing)
    session.run(existing / "pip", "install", "-q", str(wheel), external=True)
    after = _tensorflow_packages(session, existing)
    if after != before:
        session.error(f"installing kerastower changed TensorFlow: {before} -> {after}")
    _demo(session, existing)


def table() -> str:
    """The last full matrix run as a Markdown table, TensorFlow down, Keras across."""
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
            if not installable(keras, tensorflow):
                marks.append("not installable")
            elif row is None:
                marks.append("not run")
            else:
                passed = row["tests"] - row["failures"] - row["errors"]
                marks.append(
                    f"{row['outcome']} {passed}/{row['tests']}, {row['seconds']} s"
                )
        lines.append(f"| {tensorflow} | " + " | ".join(marks) + " |")
    run = [cells[k] for k in cells if k[0] in KERAS and k[1] in TENSORFLOW]
    if run:
        dates = sorted({r["date"] for r in run})
        commits = sorted({r["commit"] for r in run})
        lines += [
            "",
            f"Run {dates[0]}"
            + (f" to {dates[-1]}" if len(dates) > 1 else "")
            + f" on commit {', '.join(commits)}, Python "
            f"{', '.join(sorted({r['python'] for r in run}))}, tensorflow-cpu; "
            f"{sum(r['seconds'] for r in run) // 60} minutes of tests in all.",
        ]
    return "\n".join(lines)


def write_docs() -> None:
    """Replaces the table between the markers in ``docs/installation.md``."""
    text = DOCS.read_text()
    pattern = re.compile(r"(<!-- matrix:start -->\n).*?(<!-- matrix:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOCS} has no <!-- matrix:start/end --> markers")
    DOCS.write_text(pattern.sub(lambda m: m[1] + table() + "\n" + m[2], text))


if __name__ == "__main__":
    if "--docs" in sys.argv:
        write_docs()
    elif "--table" in sys.argv:
        print(table())
