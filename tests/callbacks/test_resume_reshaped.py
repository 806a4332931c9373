"""`BackupAndRestore` across cluster shapes: backed up on 2 workers, resumed on 3 or 1.

`tests/workers/resumable.py --global-batch 12` reads one data set on every
worker and shards it (`kerastower.cluster.shard`), each of the ``W`` workers
fitting ``12 / W`` examples a step, so every step's global batch holds the
same 12 examples whatever ``W``. Preempted on 2 workers in the middle of an
epoch, the job resumes on another number of workers, or other towers per
worker, and ends where the uninterrupted 2-worker run ends.
"""

import json
import signal
import subprocess
import sys

import pytest
from test_backup_and_restore import SCRIPT, assert_same_run, environment

GLOBAL = ("--global-batch", "12")


def launch(out, workers, towers="2", *extra):
    command = [sys.executable, "-m", "kerastower", "launch", "-n", str(workers)]
    command += ["--towers", towers, str(SCRIPT), str(out), *GLOBAL, *extra]
    return subprocess.run(
        command, env=environment(), capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    result = launch(out, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers, towers",
    [(3, "2"), (1, "2"), (2, "1,3"), (3, "3,1,2")],
    ids=["3-workers", "1-worker", "2-workers-1,3-towers", "3-workers-3,1,2-towers"],
)
def test_a_job_preempted_on_2_workers_resumes_on_another_shape_exactly(
    uninterrupted, tmp_path, workers, towers
):
    first = launch(tmp_path, 2, "2", "--sigterm-at", "6")  # epoch 1, step 2
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    resumed = launch(tmp_path, workers, towers)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The resumed run trained epochs 1 and 2, from the middle of epoch 1.
    assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_a_resume_that_would_change_the_global_batch_is_refused(tmp_path):
    # 3 workers keeping the 2-worker run's 6 examples each: 18 a step, not 12.
    first = launch(tmp_path, 2, "2", "--sigterm-at", "6")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    backup = json.loads((tmp_path / "backup" / "latest.json").read_text())
    assert backup["global_batch"] == 12
    resumed = launch(tmp_path, 3, "2", "--batch", "6")
    assert resumed.returncode != 0
    assert "took 12 examples a step (all workers' batches together); " in (
        resumed.stderr
    )
    assert "this one takes 18" in resumed.stderr
    # The backup is the one of the 2 workers, intact.
    assert json.loads((tmp_path / "backup" / "latest.json").read_text()) == backup
