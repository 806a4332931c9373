"""The (Keras, TensorFlow) version matrix: ``nox`` installs each pair and tests it.

kerastower runs on two Keras families (``kerastower._keras_compat.family``).
``KERAS`` and ``TENSORFLOW`` are the supported Keras 3 range that
``pyproject.toml`` declares, and every pair of them is run; ``KERAS2`` pairs
TensorFlow releases with the Keras 2 of their own release, the ends and
middle of the Keras 2 range:

- ``nox -s matrix`` runs the whole matrix, one session per TensorFlow
  version; ``nox -s "matrix(tensorflow='2.16.2')"`` one row of it, and
  ``nox -s "matrix(tensorflow='2.16.2')" -- 3.14.0`` one pair. A session
  installs TensorFlow once, then each Keras in turn, runs `SUITES` on each
  pair and writes one row per pair to ``bench/results/matrix.json`` (with
  the test paths it ran, ``suites``); it fails when any pair fails, after
  running the others.
- ``nox -s oldest`` runs `CI_SUITES` on the oldest pair; ``.ci/run`` runs it
  (the newest pair is what CI's own interpreter tests).
- ``nox -s matrix_keras2`` runs `KERAS2_SUITES` on each Keras 2 pair, one
  session per TensorFlow (``nox -s "matrix_keras2(tensorflow='2.12.1')"``),
  and records each row like ``matrix``; ``nox -s oldest_keras2`` runs
  `KERAS2_CI_SUITES` on the oldest Keras 2 pair without recording, and
  ``nox -s traced_keras2`` on the oldest whose towers trace once
  (TensorFlow 2.15); ``.ci/run`` runs both.
- ``nox -s replicas`` runs the whole test suite and Keras's own model and
  trainer tests (``tests/keras_suite/run.py``) on the newest pair with the
  GPU path forced on logical CPUs (``KERASTOWER_REPLICATE_VARIABLES=1``:
  per-tower replicas, ring all-reduce); CI runs the equivalence and
  property tests that way.
- ``nox -s jax`` installs ``.[jax]`` (Keras 3 on JAX, the oldest pair of
  the ``jax`` extra, `JAX_PAIR`) in a fresh environment without TensorFlow,
  runs ``tests/on_jax`` there with ``KERAS_BACKEND=jax`` and ends in
  ``kerastower demo --epochs 1`` on JAX; ``.ci/run`` runs it.
- ``nox -s package`` builds the sdist and the wheel, checks them with
  ``twine check --strict``, and installs the wheel the ways the installation
  page gives: with the ``cpu`` extra into an empty virtual environment, and
  without an extra into one that already has TensorFlow 2.16 and Keras 3,
  and into one that has TensorFlow 2.15 and its Keras 2 (each must stay as
  it was). The Keras 3 paths end in ``kerastower demo --epochs 1``; the
  Keras 2 one in ``kerastower --version``, which must name Keras 2.

``python noxfile.py --table`` prints the last results as the Markdown tables
that ``docs/installation.md`` shows, one per family, each cell naming the
suite it ran, and ``python noxfile.py --docs`` writes them there
(``bench/matrix_table.py`` renders them, without nox, from the literals
below: ``tests/test_version_claims.py`` reads them with ``ast``, checks the
tables and holds the pages' version ranges to them). Keras's own test modules
(``tests/keras_suite/run.py``, 12 to 14 minutes a pair) are not part of a
pair's run: of the Keras source releases from 3.8.0 to 3.15.1 only 3.15.1's
holds them, and CI runs them on the newest pair.
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
if str(ROOT) not in sys.path:  # nox loads this file without its folder
    sys.path.insert(0, str(ROOT))
from bench import matrix_table  # noqa: E402

RESULTS = matrix_table.RESULTS

# The supported ranges and the suites: literals, which bench/matrix_table.py
# and tests/test_version_claims.py read without importing this file.

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
    "tests/callbacks",
    "tests/test_multi_worker_scripts.py",
    "tests/test_multi_worker.py",
]
# What CI runs on the oldest pair, in about five minutes with the install: the
# tests marked `core`, collected from their own files only (`CORE` in
# tests/conftest.py: equivalence, Keras compatibility and the property
# tests), so that no other module's skip (a missing docs tool) counts.
_CORE = re.search(
    r"^CORE = (\(.*?\))$", (ROOT / "tests" / "conftest.py").read_text(), re.M | re.S
)
CI_SUITES = ["-m", "core", *ast.literal_eval(_CORE.group(1))]
# TensorBoard reads `TowerMonitor`'s event files in its tests; TensorFlow
# 2.21 no longer brings it.
TEST_REQUIREMENTS = [
    "pytest>=8",
    "pytest-xdist>=3.5",
    "hypothesis>=6.100",
    "scikit-learn>=1.3",
    "tensorboard",
]

# Keras 2, TensorFlow -> the Keras 2 of its own release (the fence in
# kerastower/_keras_compat/errors.py refuses any other): to 2.15 the `keras`
# that TensorFlow ships as `tf.keras`, from 2.16 `tf_keras` under
# TF_USE_LEGACY_KERAS=1 (the `legacy` extra). The oldest and newest of each
# kind: SUPPORTED_KERAS_2 and the `legacy` extra are their range.
KERAS2 = {
    "2.12.1": "2.12.0",
    "2.15.1": "2.15.0",
    "2.16.2": "2.16.0",
    "2.21.0": "2.21.0",
}
# The test paths that run on Keras 2, in every pair of the matrix, and what
# CI runs on the oldest pair (`oldest_keras2`, about five minutes) and on
# TensorFlow 2.15's (`traced_keras2`).
KERAS2_SUITES = [
    "tests/test_equivalence.py",
    "tests/properties",
    "tests/test_real_world_exactness.py",
    "tests/test_custom_fit_idioms.py",
    "tests/test_keras2_user_script.py",
    "tests/callbacks",
    "tests/step/test_layer_updates.py",
    "tests/test_multi_worker_scripts.py",
]
KERAS2_CI_SUITES = [
    "tests/test_equivalence.py",
    "tests/properties",
    "tests/test_custom_fit_idioms.py",
    "tests/test_keras2_user_script.py",
    "tests/step/test_layer_updates.py",
    "tests/test_testing.py",
]

# pytest as every session runs it: quiet, without a cache in the checkout.
PYTEST = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]

nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.error_on_external_run = True
nox.options.sessions = ["oldest"]

# Reads the installed versions as the tests will import them: the Keras that
# kerastower picks (its family), and the distribution that holds it.
_VERSIONS = (
    "import sys, tensorflow as tf; "
    "from kerastower._keras_compat.family import KERAS_DISTRIBUTION, KERAS_VERSION; "
    "print(KERAS_DISTRIBUTION, KERAS_VERSION, tf.__version__, "
    "'%d.%d' % sys.version_info[:2])"
)


_key = matrix_table.key
_minor = matrix_table.minor
_legacy = matrix_table.legacy


def _keras2_pair(tensorflow: str) -> tuple[list[str], dict[str, str]]:
    """The requirements and environment of `tensorflow`'s Keras 2 pair."""
    requirements = matrix_table.keras2_requirements(tensorflow, KERAS2[tensorflow])
    return requirements, _LEGACY_ENV if _legacy(tensorflow) else _ENV


def _declared_range(session: nox.Session) -> None:
    """Fails unless ``pyproject.toml`` and the fence declare the matrix's ranges.

    The `cpu` and `gpu` extras: exactly `KERAS` x `TENSORFLOW`; the `legacy`
    extra: the `tf_keras` of `KERAS2`; ``SUPPORTED_KERAS_2`` in
    ``kerastower/_keras_compat/errors.py``: all of `KERAS2`. No Keras or
    TensorFlow among the dependencies: it would replace the user's.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    tensorflow = f">={TENSORFLOW[0]},<{_minor(TENSORFLOW[-1], 1)}"
    keras = f"keras>={_minor(KERAS[0])},<{_minor(KERAS[-1], 1)}"
    tf_keras = [k for tf, k in KERAS2.items() if _legacy(tf)]
    expected = [
        ("cpu", keras),
        ("cpu", f"tensorflow-cpu{tensorflow}"),
        ("gpu", keras),
        ("gpu", f"tensorflow[and-cuda]{tensorflow}"),
        ("legacy", f"tf_keras>={_minor(tf_keras[0])},<{_minor(tf_keras[-1], 1)}"),
    ]
    for extra, requirement in expected:
        if requirement not in extras[extra]:
            session.error(
                f"pyproject.toml's `{extra}` extra must declare the matrix's range "
                f"{requirement!r}. Received: {extras[extra]}"
            )
    if any(re.match(r"keras|tf.keras|tensorflow", r) for r in project["dependencies"]):
        session.error(
            "pyproject.toml's dependencies must leave Keras and TensorFlow to "
            f"the extras. Received: {project['dependencies']}"
        )
    errors = (ROOT / "kerastower" / "_keras_compat" / "errors.py").read_text()
    fence = re.search(r'^SUPPORTED_KERAS_2 = "(.*)"$', errors, re.M)
    keras2 = list(KERAS2.values())
    range_2 = f">={_minor(keras2[0])},<{_minor(keras2[-1], 1)}"
    if fence is None or fence[1] != range_2:
        session.error(
            f"errors.py's SUPPORTED_KERAS_2 must be the matrix's {range_2!r}. "
            f"Received: {fence and fence[1]!r}"
        )


def _install(session: nox.Session, *requirements: str) -> None:
    """Installs `requirements` (a pair), the test tools and kerastower."""
    _declared_range(session)
    # TensorFlow 2.12 to 2.17 need numpy 1, 2.18 and 2.19 numpy < 2.2: pip
    # resolves it from their pins.
    session.install(*requirements)
    session.install(*TEST_REQUIREMENTS)
    session.install("--no-deps", "-e", ".")


def _check_versions(
    session: nox.Session, keras: str, tensorflow: str, env: dict[str, str] | None = None
) -> str:
    """Checks the pair the tests will import; returns the Python version."""
    env = env or _ENV
    out = session.run("python", "-c", _VERSIONS, silent=True, env=env)
    if out is None:  # `--install-only`: installed, nothing to check or run
        session.skip("installed only")
    *installed, python = out.split()[-4:]
    distribution = "tf_keras" if env["TF_USE_LEGACY_KERAS"] == "1" else "keras"
    if installed != [distribution, keras, tensorflow]:
        session.error(
            f"asked for {distribution} {keras} and TensorFlow {tensorflow}; the "
            f"session's kerastower imports {installed[0]} {installed[1]} and "
            f"TensorFlow {installed[2]}"
        )
    return python


# TF_USE_LEGACY_KERAS set either way, so that the shell's cannot switch a
# pair's family (kerastower follows it as `tf.keras` does).
_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "KERAS_BACKEND": "tensorflow",
    "TF_USE_LEGACY_KERAS": "0",
}
_LEGACY_ENV = {**_ENV, "TF_USE_LEGACY_KERAS": "1"}


def _test_pair(
    session: nox.Session,
    keras: str,
    tensorflow: str,
    suites: list[str],
    env: dict[str, str] | None = None,
) -> dict:
    """Runs `suites` on the installed pair; returns its row of the matrix.

    The row keeps `suites`, the test paths given to pytest: the table's
    cells name the suite each pair ran (``bench/matrix_table.py``).
    """
    env = env or _ENV
    python = _check_versions(session, keras, tensorflow, env)
    junit = Path(session.create_tmp()) / f"keras-{keras}.xml"
    start = time.time()
    try:
        session.run(
            *PYTEST,
            "-rfEs",
            f"--junitxml={junit}",
            "-m",
            "",  # the `slow` tests too, unless `suites` choose
            *suites,
            env=env,
        )
        outcome = "passed"
    except nox.command.CommandFailed:
        outcome = "failed"
    counts = _counts(junit)
    if outcome == "passed" and (counts["tests"] == 0 or counts["skipped"]):
        outcome = "failed"  # a pair that ran nothing, or skipped a test, is not green
        session.warn(f"Keras {keras}, TensorFlow {tensorflow}: {counts}")
    return dict(
        family=_key(keras)[0],
        keras=keras,
        tensorflow=tensorflow,
        python=python,
        outcome=outcome,
        **counts,
        seconds=round(time.time() - start),
        suites=list(suites),
        commit=_commit(),
        date=time.strftime("%Y-%m-%d"),
    )


# The skip reasons of tests that one Keras family lacks by design
# (tests/keras_family.py), or that the pair's Keras release lacks ("Keras
# 2.12 has no Lion"): not a failure of the pair, counted as `other_family`.
FAMILY_SKIPS = ("Keras 3 only", "Keras 2 only", "not on Keras 2 yet", " has no ")


def _counts(junit: Path) -> dict[str, int]:
    counts = dict(tests=0, failures=0, errors=0, skipped=0, other_family=0)
    if junit.exists():
        tree = ET.parse(junit)
        for suite in tree.iter("testsuite"):
            for key in ("tests", "failures", "errors", "skipped"):
                counts[key] += int(suite.get(key, 0))
        for skip in tree.iter("skipped"):
            if any(reason in skip.get("message", "") for reason in FAMILY_SKIPS):
                counts["other_family"] += 1
    counts["skipped"] -= counts["other_family"]
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


def installable(keras: str, tensorflow: str) -> bool:
    """Whether pip can install the pair (TensorFlow's own Keras requirement)."""
    return matrix_table.installable(keras, tensorflow, TENSORFLOW_NEEDS_KERAS)


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
        _install(session, f"tensorflow-cpu=={tensorflow}", f"keras=={keras}")
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
    _install(session, f"tensorflow-cpu=={tensorflow}", f"keras=={keras}")
    session.log(f"installed in {time.time() - start:.0f} s")
    row = _test_pair(session, keras, tensorflow, CI_SUITES)
    session.log(f"{row}")
    if row["outcome"] != "passed":
        session.error(f"Keras {keras} with TensorFlow {tensorflow} fails")


def _keras2(session: nox.Session, tensorflow: str, suites=KERAS2_SUITES) -> dict:
    """Installs `tensorflow`'s Keras 2 pair and runs `suites` on it."""
    requirements, env = _keras2_pair(tensorflow)
    start = time.time()
    _install(session, *requirements)
    session.log(f"{' '.join(requirements)}: installed in {time.time() - start:.0f} s")
    row = _test_pair(session, KERAS2[tensorflow], tensorflow, suites, env)
    session.log(f"{row}")
    return row


@nox.session
@nox.parametrize("tensorflow", list(KERAS2))
def matrix_keras2(session: nox.Session, tensorflow: str) -> None:
    """`KERAS2_SUITES` on one TensorFlow with the Keras 2 of its release."""
    row = _keras2(session, tensorflow)
    _record(row)
    if row["outcome"] != "passed":
        session.error(f"TensorFlow {tensorflow} fails with its Keras 2")


@nox.session
def oldest_keras2(session: nox.Session) -> None:
    """`KERAS2_CI_SUITES` on the oldest Keras 2 pair (not recorded)."""
    _keras2_ci(session, next(iter(KERAS2)))


# The oldest TensorFlow whose towers call one traced function
# (`keeps_functions_apart`); before it, each tower traces a copy.
TRACED_ONCE_KERAS2 = "2.15.1"


@nox.session
def traced_keras2(session: nox.Session) -> None:
    """`KERAS2_CI_SUITES` on the oldest Keras 2 pair whose towers trace once."""
    _keras2_ci(session, TRACED_ONCE_KERAS2)


def _keras2_ci(session: nox.Session, tensorflow: str) -> None:
    row = _keras2(session, tensorflow, KERAS2_CI_SUITES)
    if row["outcome"] != "passed":
        session.error(f"Keras {KERAS2[tensorflow]} with TensorFlow {tensorflow} fails")


# Keras 3 on JAX: the oldest (Keras, jax) pair of the `jax` extra, which
# kerastower/_keras_compat/jax's ranges repeat. jax 0.11.2 ran on a GPU only
# (bench/results/jax_gpu.json): this registry's newest jax is 0.10.2.
JAX_PAIR = {"keras": "3.15.1", "jax": "0.10.2"}
JAX_SUITES = ["tests/on_jax"]


@nox.session
def jax(session: nox.Session) -> None:
    """``tests/on_jax`` and the demo on Keras's JAX backend, from ``.[jax]``."""
    session.install(
        ".[jax]",
        f"keras=={JAX_PAIR['keras']}",
        f"jax=={JAX_PAIR['jax']}",
        *TEST_REQUIREMENTS[:3],
    )
    env = {"KERAS_BACKEND": "jax", "TF_USE_LEGACY_KERAS": "0"}
    imported = session.run(
        "python",
        "-c",
        "import jax, keras; print(keras.__version__, jax.__version__)",
        silent=True,
        env=env,
    ).split()[-2:]
    if imported != [JAX_PAIR["keras"], JAX_PAIR["jax"]]:
        session.error(f"asked for {JAX_PAIR}; the session imports {imported}")
    if "tensorflow" in session.run("pip", "freeze", silent=True).lower():
        session.error("`.[jax]` brought TensorFlow")
    session.run(
        *PYTEST,
        "-rfEs",
        *JAX_SUITES,
        env=env,
    )
    session.run("kerastower", "demo", "--epochs", "1", "--quiet", env=env)


@nox.session
def replicas(session: nox.Session) -> None:
    """Every test, and Keras's peer suite, with replicas forced on (newest pair)."""
    keras, tensorflow = KERAS[-1], TENSORFLOW[-1]
    # The development extras too: the docs and benchmark tests need them.
    session.install(f"tensorflow-cpu=={tensorflow}", f"keras=={keras}", "-e", ".[dev]")
    _check_versions(session, keras, tensorflow)
    env = {**_ENV, "KERASTOWER_REPLICATE_VARIABLES": "1"}
    session.run(*PYTEST, "-m", "", env=env)
    session.run("python", "tests/keras_suite/run.py", env=env)


@nox.session(python=False)
def slow(session: nox.Session) -> None:
    """The `slow` tests, which the default run leaves out (current environment).

    Several processes (workers, kills, restarts) and benchmark runs, about
    15 minutes on 2 cores; arguments after ``--`` go to pytest.
    """
    session.run(*PYTEST, "-m", "slow", *session.posargs)


def _venv(session: nox.Session, path: Path, *requirements: str) -> Path:
    """A fresh virtual environment at `path` with `requirements`; its ``bin``."""
    shutil.rmtree(path, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(path), external=True)
    bin_dir = path / "bin"
    if requirements:
        session.run(bin_dir / "pip", "install", "-q", *requirements, external=True)
    return bin_dir


def _tensorflow_packages(session: nox.Session, bin_dir: Path) -> list[str]:
    """The installed TensorFlow and Keras distributions, ``name==version``."""
    frozen = session.run(bin_dir / "pip", "freeze", silent=True, external=True)
    return sorted(
        line
        for line in frozen.splitlines()
        if re.match(r"(tensorflow\S*|keras|tf[-_]keras)==", line, re.I)
    )


def _demo(session: nox.Session, bin_dir: Path) -> None:
    session.run(bin_dir / "kerastower", "--version", external=True, env=_ENV)
    session.run(bin_dir / "kerastower", "demo", "--epochs", "1", external=True)


def _install_beside(
    session: nox.Session, bin_dir: Path, wheel: Path, before: list[str]
) -> None:
    """Installs `wheel` without an extra; fails if TensorFlow or Keras changed."""
    session.run(bin_dir / "pip", "install", "-q", str(wheel), external=True)
    after = _tensorflow_packages(session, bin_dir)
    if after != before:
        session.error(f"installing kerastower changed TensorFlow: {before} -> {after}")


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
    _install_beside(session, existing, wheel, _tensorflow_packages(session, existing))
    _demo(session, existing)

    # TensorFlow 2.15 and the Keras 2 it ships as `tf.keras`: the wheel
    # without an extra must not bring Keras 3 (which would break `tf.keras`).
    # `--version` names the family, and the demo's float64 verdict holds.
    requirements, env = _keras2_pair("2.15.1")
    keras2 = _venv(session, tmp / "keras2", *requirements)
    _install_beside(session, keras2, wheel, _tensorflow_packages(session, keras2))
    version = session.run(
        keras2 / "kerastower", "--version", external=True, env=env, silent=True
    )
    if "Keras 2.15.0 (tf.keras)" not in version:
        session.error(f"expected Keras 2.15.0 (tf.keras). Received: {version}")
    session.run(
        keras2 / "kerastower",
        "demo",
        "--epochs",
        "1",
        "--quiet",
        external=True,
        env=env,
    )


def _declared() -> dict:
    """The constants bench/matrix_table.py renders the tables from."""
    return {name: globals()[name] for name in matrix_table.DECLARED}


def table() -> str:
    """The last Keras 3 run as a Markdown table, TensorFlow down, Keras across."""
    return matrix_table.table(matrix_table.load(RESULTS), _declared())


def table_keras2() -> str:
    """The last Keras 2 run as a Markdown table, one pair a line."""
    return matrix_table.table_keras2(matrix_table.load(RESULTS), _declared())


def write_docs() -> None:
    """Replaces each table between its markers in ``docs/installation.md``."""
    matrix_table.write_docs(_declared(), RESULTS)


if __name__ == "__main__":
    if "--docs" in sys.argv:
        write_docs()
    elif "--table" in sys.argv:
        print(table(), table_keras2(), sep="\n\n")
