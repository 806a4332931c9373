"""Keras's own model and trainer tests as a peer suite for `TowerModel`.

Takes the sdist of the installed Keras version from the package registry,
extracts four of its test modules and runs them twice with pytest: a baseline
on `keras.Model` and a swapped run where the names the modules use for
`keras.Model` are `kerastower.TowerModel` on four logical CPUs (see
`plugin.py`, which becomes the extracted directory's ``conftest.py``). Fails
when a test that passes on the baseline does not pass swapped, unless it is
in `ALLOWED` with its reason, or when the swapped run made no `TowerModel`,
ran no tower step or ran towers other than four.

Run it from the repository root:

```
python tests/keras_suite/run.py            # both runs, side by side
python tests/keras_suite/run.py -k fit     # a subset, for triage
```

The two runs take about 7 CPU-minutes together (12 to 14 minutes of wall time
on two cores shared with other work). The sdist is cached in
``.cache/keras_suite/``; the extracted modules, the logs, the JUnit files and
the counters are in ``.cache/keras_suite/keras-<version>/``, where
``PYTHONPATH=<repo> python -m pytest --tower-mode=swapped`` reruns the
swapped suite by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "keras_suite"
HERE = Path(__file__).resolve().parent
NUM_TOWERS = 4  # as configured by plugin.py

MODULES = [
    "keras/src/trainers/trainer_test.py",
    "keras/src/models/model_test.py",
    "keras/src/models/functional_test.py",
    "keras/src/models/sequential_test.py",
]

# Tests that may pass on keras.Model and fail on TowerModel because they
# assert the exact class, with the reason. A genuine difference never goes
# here: it fails the suite until kerastower is fixed.
ALLOWED: dict[str, str] = {
    "functional_test.FunctionalTest::test_basic_flow_multi_input": (
        "builds keras's `Functional` directly and asserts it is an instance "
        "of `Model`; a plain Functional is rightly no TowerModel"
    ),
}

# Packages that some of the modules' tests import and the dev extra does not
# install (jax, torch and grain data pipelines): their tests fail on the
# baseline too, so they are not compared.
OPTIONAL_PACKAGES = ("jax", "torch", "grain")


def fetch_sdist(keras_version: str) -> Path:
    """The cached keras sdist, downloaded with pip on first use."""
    sdist = CACHE / f"keras-{keras_version}.tar.gz"
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"keras=={keras_version}",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    if not sdist.exists():
        raise SystemExit(f"pip download did not produce {sdist}")
    return sdist


def extract(sdist: Path, keras_version: str) -> Path:
    """Extracts the test modules and Keras's pytest configuration, flat."""
    run_dir = CACHE / f"keras-{keras_version}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    prefix = f"keras-{keras_version}/"
    wanted = {prefix + m: Path(m).name for m in MODULES}
    wanted[prefix + "pyproject.toml"] = "pyproject.toml"
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if member.name in wanted:
                source = tar.extractfile(member)
                (run_dir / wanted.pop(member.name)).write_bytes(source.read())
    if wanted:
        raise SystemExit(f"{sdist.name} lacks {sorted(wanted)}")
    shutil.copy(HERE / "plugin.py", run_dir / "conftest.py")
    return run_dir


class PytestRun:
    """One mode's pytest process, started at once; `result` waits for it."""

    def __init__(self, run_dir: Path, mode: str, extra: list[str]):
        self.mode = mode
        self.junit = run_dir / f"{mode}.xml"
        self.report = run_dir / f"{mode}.json"
        self.log = run_dir / f"{mode}.log"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        # This checkout's kerastower, whatever is installed.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rfE",
            f"--tower-mode={mode}",
            f"--tower-report={self.report}",
            f"--junitxml={self.junit}",
            *extra,
        ]
        self.start = time.monotonic()
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                command, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def result(self) -> tuple[dict[str, tuple[str, str]], dict]:
        """Per-test outcomes and the plugin's counters."""
        code = self.process.wait()
        seconds = time.monotonic() - self.start
        if code not in (0, 1):
            print(self.log.read_text()[-5000:])
            raise SystemExit(f"{self.mode} run: pytest exited {code}; see {self.log}")
        print(f"{self.mode}: pytest took {seconds:.0f} s (log: {self.log})", flush=True)
        return outcomes(self.junit), json.loads(self.report.read_text())


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``{"module.Class::test": (outcome, message)}`` from a JUnit file.

    The outcome is ``"passed"``, ``"failed"``, ``"error"`` or ``"skipped"``.
    """
    result = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        result[test_id] = ("passed", "")
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                result[test_id] = (outcome, child.get("message") or "")
                break
    return result


def count(results: dict[str, tuple[str, str]], outcome: str) -> int:
    return sum(1 for v, _ in results.values() if v == outcome)


def summary(results: dict[str, tuple[str, str]]) -> str:
    return "; ".join(
        f"{count(results, outcome)} {outcome}"
        for outcome in ("passed", "failed", "error", "skipped")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    args = parser.parse_args(argv)
    extra = ["-k", args.keyword] if args.keyword else []

    start = time.monotonic()
    keras_version = version("keras")
    run_dir = extract(fetch_sdist(keras_version), keras_version)
    # The two runs are independent processes: run them side by side.
    runs = [PytestRun(run_dir, mode, extra) for mode in ("baseline", "swapped")]
    (baseline, baseline_counts), (swapped, swapped_counts) = [
        run.result() for run in runs
    ]

    passed = {t for t, (v, _) in baseline.items() if v == "passed"}
    lost = sorted(t for t in passed if swapped.get(t, ("missing",))[0] != "passed")
    allowed = [t for t in lost if t in ALLOWED]
    unexpected = [t for t in lost if t not in ALLOWED]
    stale = sorted(t for t in ALLOWED if t not in allowed)
    unexplained = sorted(
        t
        for t, (v, message) in baseline.items()
        if v in ("failed", "error")
        and not any(f"No module named '{p}" in message for p in OPTIONAL_PACKAGES)
    )
    modules_without_pass = sorted(
        m for m in MODULES if not any(t.startswith(Path(m).stem) for t in passed)
    )

    print(f"keras {keras_version}: {len(MODULES)} test modules, {len(baseline)} tests")
    print(f"baseline (keras.Model): {summary(baseline)}")
    print(f"swapped (TowerModel, {NUM_TOWERS} logical CPUs): {summary(swapped)}")
    print(
        f"swap proof: {swapped_counts['tower_model_instances']} TowerModel "
        f"instances {swapped_counts['instances_by_class']}; "
        f"{swapped_counts['tower_steps']} tower steps run; towers per traced "
        f"step: {swapped_counts['traced_tower_runs_by_num_towers']}; tests that "
        f"made a TowerModel: {swapped_counts['tests_making_tower_models']}; "
        f"that ran tower steps: {swapped_counts['tests_running_tower_steps']}"
    )
    if unexplained:
        print(f"baseline failures besides missing {OPTIONAL_PACKAGES}: {unexplained}")
    print(f"allowed: {len(allowed)}")
    for test in allowed:
        print(f"  {test}: {ALLOWED[test]}")
    if stale:
        print(f"in ALLOWED but not lost (remove them?): {stale}")
    print(f"lost: {len(unexpected)}")
    for test in unexpected:
        outcome, message = swapped.get(test, ("missing", ""))
        print(
            f"  {test} ({outcome}: {message.splitlines()[0][:200] if message else ''})"
        )

    failures = []
    if unexpected:
        failures.append(f"{len(unexpected)} tests pass on keras.Model only")
    if modules_without_pass and not args.keyword:
        failures.append(f"no test passes on the baseline in {modules_without_pass}")
    if baseline_counts["tower_model_instances"]:
        failures.append("the baseline run made TowerModel instances")
    if not swapped_counts["tower_model_instances"]:
        failures.append("the swapped run made no TowerModel")
    if not swapped_counts["tower_steps"]:
        failures.append("the swapped run ran no tower step")
    if set(swapped_counts["traced_tower_runs_by_num_towers"]) - {str(NUM_TOWERS)}:
        failures.append(f"the swapped run used other than {NUM_TOWERS} towers")
    seconds = time.monotonic() - start
    if failures:
        print(f"keras_suite FAILED in {seconds:.0f} s: " + "; ".join(failures))
        return 1
    print(f"keras_suite passed in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
