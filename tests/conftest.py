"""Test setup: four logical CPUs, configured before TensorFlow starts.

With ``KERAS_BACKEND=jax`` the suite is `tests/on_jax` alone, on four CPU devices
of JAX's own (``XLA_FLAGS``, set before JAX starts); on TensorFlow that
folder is skipped, since it needs jax (``nox -s jax`` runs it).
"""

import fcntl
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Hypothesis profiles (the property tests of both backends): tracing and
# compiling make timing deadlines meaningless.
for _name, _examples, _fixed in (("ci", 12, True), ("dev", 60, False)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        deadline=None,
        derandomize=_fixed,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
NUM_DEVICES = 4
ON_JAX = os.environ.get("KERAS_BACKEND") == "jax"

if ON_JAX:
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        ]
    ).strip()
    collect_ignore = [
        p.name
        for p in Path(__file__).parent.iterdir()
        if p.name not in ("on_jax", "conftest.py")
    ]
else:
    collect_ignore = ["on_jax"]
    import tensorflow as tf

    import kerastower

    kerastower.configure_logical_devices(NUM_DEVICES)
    assert len(tf.config.list_logical_devices("CPU")) == NUM_DEVICES


@pytest.fixture
def float64():
    """Builds the test's models in float64 (floatx and the dtype policy)."""
    from oracle import float64 as in_float64

    with in_float64():
        yield


# The core of the promise, towers against one device, in a few minutes:
# `python -m pytest -m core` (README), and what `nox -s oldest` runs. One
# multi-worker case: TensorFlow's collective start-up changed between
# releases (2.16's failed to start, unseen, while CI ran workers on 2.21).
CORE = (
    "tests/test_equivalence.py",
    "tests/test_keras_compat.py",
    "tests/properties/",
    "tests/test_multi_worker_scripts.py::"
    "test_natural_script_trains_the_one_device_model[2-2,3-masked]",
)


# The tests that signal processes of their own at a given step or bound their
# time (a SIGTERM at step 3 that both workers must agree on, a collective
# timeout, a dying worker found in bounded time, a grace period), and those
# that fill the disk the others write to: under pytest-xdist (``-n``,
# pyproject.toml) each runs while no other test does, so that another test's
# tracing on the same cores cannot move their moments. (Under load, two
# workers once agreed on a preemption one step later.) Kills at random
# instants and multi-worker training are checked by their results, not their
# timing, and share the cores. Node-id prefixes.
EXCLUSIVE = (
    "tests/callbacks/test_backup_and_restore.py::test_sigterm_",
    "tests/cli/test_launch_command.py::test_ctrl_c_",
    "tests/cli/test_launch_command.py::test_workers_get_sigterm_",
    "tests/cli/test_launch_command.py::test_signals_to_the_launcher_",
    "tests/cli/test_launch_command.py::test_a_hung_worker_",
    "tests/cli/test_launch_workers.py::test_a_worker_that_ignores_sigterm_",
    "tests/cli/test_launch_workers.py::test_a_worker_that_ends_between_two_polls_",
    "tests/cli/test_launch_workers.py::test_a_worker_killed_by_a_signal_",
    "tests/cli/test_launch_workers.py::test_a_signal_to_the_launcher_",
    "tests/test_multi_worker.py::test_a_dying_worker_",
    "tests/test_multi_worker.py::test_a_later_timeout_",
    "tests/test_reliability.py::",
)


# The longest files (``--durations``: 150-550 s of CPU each), handed out
# first: pytest-xdist gives the workers whole files in collection order, and a
# long file left for last would keep one worker busy while the other idles.
LONGEST_FIRST = (
    "tests/test_examples.py",
    "tests/test_multi_worker_scripts.py",
    "tests/callbacks/test_backup_and_restore.py",
    "tests/properties/test_model_families.py",
    "tests/callbacks/test_resume_reshaped.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        file = item.nodeid.partition("::")[0]
        ranked = file in LONGEST_FIRST
        return LONGEST_FIRST.index(file) if ranked else len(LONGEST_FIRST)

    items.sort(key=rank)
    for item in items:
        if item.nodeid.startswith(CORE):
            item.add_marker(pytest.mark.core)
        if item.nodeid.startswith(EXCLUSIVE):
            item.add_marker(pytest.mark.exclusive)
    # A renamed test would silently share the cores: each prefix whose file
    # was collected names a test.
    ids = [item.nodeid for item in items]
    files = {i.partition("::")[0] for i in ids}
    stale = [
        prefix
        for prefix in EXCLUSIVE
        if prefix.partition("::")[0] in files
        and not any(i.startswith(prefix) for i in ids)
    ]
    addopts = config.getini("addopts")  # its `-m`: the default run's selection
    default = addopts[addopts.index("-m") + 1] if "-m" in addopts else ""
    marks = config.getoption("markexpr")
    if stale and not config.getoption("keyword") and marks in ("", default):
        raise pytest.UsageError(f"EXCLUSIVE names no test: {stale}")


@pytest.fixture(autouse=True)
def _cores(request, tmp_path_factory):
    """Holds the xdist workers' shared lock through a test: an `exclusive`
    test takes it alone, any other shares it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    alone = request.node.get_closest_marker("exclusive") is not None
    # The parent of a worker's temporary directory is the run's, shared.
    path = tmp_path_factory.getbasetemp().parent / "cores.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
