"""Preemption and kills: every resumed run ends equal to the uninterrupted one.

`tests/workers/resumable.py` trains with `BackupAndRestore(save_freq=1)`;
the tests stop it with SIGTERM (a scheduler's preemption) or SIGKILL (a crash)
at chosen and at random moments, in the middle of epochs and of
`GradientAccumulation` windows, on one worker and on two, start it again on
the same directory until it finishes, and compare the final weights and the
history of the epochs the last run trained with an uninterrupted run.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from oracle import assert_close

SCRIPT = Path(__file__).resolve().parents[1] / "workers" / "resumable.py"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def command(out, *extra, workers=1, launcher=()):
    if workers == 1:
        return [sys.executable, str(SCRIPT), str(out), *extra]
    head = [sys.executable, "-m", "kerastower", "launch", "-n", str(workers)]
    return [*head, *launcher, "--towers", "2", str(SCRIPT), str(out), *extra]


def environment():
    env = dict(os.environ, **ENV)
    env.pop("TF_CONFIG", None)
    return env


def run(out, *extra, workers=1, launcher=(), timeout=240):
    return subprocess.run(
        command(out, *extra, workers=workers, launcher=launcher),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def finals(out, workers=1):
    result = []
    for index in range(workers):
        with np.load(Path(out) / f"final{index}.npz") as data:
            result.append([data[f"arr_{k}"] for k in range(len(data.files))])
    return result


def history(out, index=0):
    return json.loads((Path(out) / f"history{index}.json").read_text())


def check_backup_whole(out):
    """The backup on disk is complete: its pointer names files that load."""
    backup = Path(out) / "backup"
    pointer = backup / "latest.json"
    if not pointer.exists():
        return None
    state = json.loads(pointer.read_text())
    assert (backup / state["weights"]).stat().st_size > 0
    with np.load(backup / state["arrays"]) as data:
        assert len(data.files) == state["metrics"] + state["window"]
    return state


def assert_same_run(reference, resumed, workers=1):
    for ref, got in zip(finals(reference, workers), finals(resumed, workers)):
        for a, b in zip(ref, got, strict=True):
            # Same ops in the same order: equal, up to the rounding of
            # restoring float32 values (measured: 0.0).
            assert_close(b, a)
    full, last = history(reference), history(resumed)
    tail = {k: v[-len(last["epochs"]) :] for k, v in full.items()}
    assert last["epochs"] == tail["epochs"]
    assert_close(last["loss"], tail["loss"])
    assert_close(last["mae"], tail["mae"])


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, computed once: plain, accumulating, two workers."""
    runs = {}
    for name, extra, workers in [
        ("plain", (), 1),
        ("accumulate", ("--accumulate", "3"), 1),
        ("workers", (), 2),
    ]:
        out = tmp_path_factory.mktemp(name)
        result = run(out, *extra, workers=workers)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert not (out / "backup").exists()  # deleted after a normal end
        runs[name] = out
    return runs


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_that_step_and_resumes_exactly(references, tmp_path):
    first = run(tmp_path, "--sigterm-at", "5")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    state = check_backup_whole(tmp_path)
    assert (state["epoch"], state["step"]) == (1, 2)  # global step 5 is done
    second = run(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert_same_run(references["plain"], tmp_path)


@pytest.mark.slow
def test_sigterm_in_an_accumulation_window_resumes_into_that_window(
    references, tmp_path
):
    # Windows of 3 micro-batches in epochs of 4: step 5 is the 2nd of the
    # epoch's first window, so the backup holds a half-full window.
    first = run(tmp_path, "--accumulate", "3", "--sigterm-at", "5")
    assert first.returncode == 128 + signal.SIGTERM
    state = check_backup_whole(tmp_path)
    with np.load(tmp_path / "backup" / state["arrays"]) as data:
        micro_batches = data[f"arr_{state['metrics'] + state['window'] - 2}"]
    assert int(micro_batches) == 2
    second = run(tmp_path, "--accumulate", "3")
    assert second.returncode == 0, second.stderr[-2000:]
    assert_same_run(references["accumulate"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "check_freq, stopped_at, state",
    # SIGTERM reaches worker 1 in global step 6 (epoch 1, step 2). Checking
    # every 3 steps, the workers agree after step 8 (epoch 2, step 0): the
    # count goes on over the epoch's end.
    [(1, "STEP 1 2", (1, 3)), (3, "STEP 2 0", (2, 1))],
)
def test_sigterm_to_one_worker_stops_both_at_the_same_step(
    references, tmp_path, check_freq, stopped_at, state
):
    first = run(
        tmp_path,
        "--sigterm-at",
        "6",
        "--only-worker",
        "1",
        "--check-freq",
        str(check_freq),
        workers=2,
    )
    assert first.returncode == 128 + signal.SIGTERM, first.stdout[-3000:]
    saved = check_backup_whole(tmp_path)
    assert (saved["epoch"], saved["step"]) == state
    # Neither worker ran a step past the one the preemption was agreed at.
    for index in (0, 1):
        steps = [
            line
            for line in first.stdout.splitlines()
            if f"[worker {index}] STEP" in line
        ]
        assert steps[-1].endswith(stopped_at)
    second = run(tmp_path, workers=2)
    assert second.returncode == 0, second.stdout[-3000:]
    assert_same_run(references["workers"], tmp_path, workers=2)


def _kill_at_random_moment(out, extra, workers, rng, trial):
    """Starts a run and stops it at a random moment; returns its exit status.

    One worker: SIGKILL from outside, after a random number of steps plus a
    random delay (so it lands in a step or in a backup). Two workers: the
    launcher gets SIGTERM, as from a scheduler, and forwards it (even
    trials), or every worker SIGKILLs itself at a random step (odd trials).
    """
    wanted = rng.randrange(1, 8)
    if workers > 1 and trial % 2:
        return run(out, *extra, "--kill-at", str(wanted), workers=workers).returncode
    proc = subprocess.Popen(
        command(out, *extra, workers=workers),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seen = 0
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        seen += "STEP" in line
        if seen >= wanted * workers or time.monotonic() > deadline:
            time.sleep(rng.uniform(0.0, 0.05))  # mid-step or mid-backup
            break
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if workers == 1 else signal.SIGTERM)
    proc.communicate(timeout=120)
    return proc.returncode  # 0 when the run finished before the kill


@pytest.mark.slow
def test_ten_kills_at_random_moments_leave_whole_backups_and_exact_resumes(
    references, tmp_path
):
    rng = random.Random(20261123)
    trials = []
    plans = [
        ("plain", (), 1, 4),
        ("accumulate", ("--accumulate", "3"), 1, 3),
        ("workers", (), 2, 3),
    ]
    for name, extra, workers, kills in plans:
        out = tmp_path / name
        out.mkdir()
        done = 0
        for _ in range(kills + 3):  # a run may finish before its kill comes
            if _kill_at_random_moment(out, extra, workers, rng, done) == 0:
                continue
            state = check_backup_whole(out)
            trials.append(
                (name, None if state is None else (state["epoch"], state["step"]))
            )
            done += 1
            if done == kills:
                break
        assert done == kills, trials
        result = run(out, *extra, workers=workers)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert_same_run(references[name], out, workers=workers)
    assert len(trials) >= 10
    print("kill trials (scenario, backup position after the kill):", trials)


@pytest.mark.slow
def test_launch_restarts_the_workers_after_a_kill_and_they_resume_exactly(
    references, tmp_path
):
    # `kerastower launch --max-restarts`: one worker SIGKILLed at a random
    # moment of the first start; the launcher stops the other, starts both
    # again, and they go on from the backup to the uninterrupted run's end.
    rng = random.Random(20261126)
    for trial in range(5):
        out = tmp_path / f"trial{trial}"
        out.mkdir()
        kill = ["--kill-at", str(rng.randrange(0, 8))]
        kill += ["--only-worker", str(rng.randrange(2)), "--only-first-start"]
        kill += ["--kill-delay", f"{rng.uniform(0.0, 0.02):.3f}"]
        launcher = ("--max-restarts", "2", "--grace-period", "2")
        result = run(out, *kill, workers=2, launcher=launcher)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (
            "was killed by SIGKILL; stopped the others" in result.stderr
            and "after exit status 137 (restart 1 of 2)" in result.stderr
        ), (kill, result.stderr[-3000:])
        assert "restart 2 of 2" not in result.stderr
        assert_same_run(references["workers"], out, workers=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(backup_dir=""),
            "`backup_dir` must be a directory path. Received: backup_dir=''",
        ),
        (
            dict(save_freq=0),
            "`save_freq` must be 'epoch' or an integer >= 1. Received: save_freq=0",
        ),
        (dict(save_freq="batch"), "Received: save_freq='batch'"),
        (dict(grace_period=0), "`grace_period` must be > 0. Received: grace_period=0"),
        (dict(grace_period="30"), "Received: grace_period='30'"),
        (
            dict(exit_code=1.5),
            "`exit_code` must be an integer or None. Received: exit_code=1.5",
        ),
        (
            dict(signals=signal.SIGTERM),
            "`signals` must be a sequence of signal numbers",
        ),
        (dict(signals=("SIGTERM",)), "Received: signals=('SIGTERM',)"),
        (
            dict(check_freq=0),
            "`check_freq` must be an integer >= 1. Received: check_freq=0",
        ),
    ],
)
def test_bad_arguments_name_the_argument_and_the_value(kwargs, message):
    import kerastower

    arguments = {"backup_dir": "backup", **kwargs}
    with pytest.raises(ValueError) as info:
        kerastower.callbacks.BackupAndRestore(**arguments)
    assert message in str(info.value)
