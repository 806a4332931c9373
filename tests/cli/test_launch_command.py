"""The `kerastower launch` command end to end, in a process of its own.

It starts without TensorFlow, passes each worker its arguments, turns Ctrl-C
and its own death into SIGTERM for the workers, gives the first failure's
status, never restarts the workers after a signal of its own, says where a
hung worker was and, with `--hosts`, prints a TF_CONFIG.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from worker_scripts import (
    ENV_SCRIPT,
    FAIL_SCRIPT,
    ROOT,
    SIGNAL_SCRIPT,
    start_cli,
    wait_for,
    write_script,
)

from kerastower.workers import launch


def test_command_passes_the_script_its_arguments_without_loading_tensorflow(
    tmp_path,
):
    script, out = write_script(tmp_path, ENV_SCRIPT)
    args = ["-n", "5", "--towers", "x", "--", "-h"]
    proc = start_cli("launch", "-n", "2", "--towers", "3", script, out, *args)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    for i in range(2):
        seen = json.loads(Path(out, f"worker{i}.json").read_text())
        assert seen["argv"] == args
        assert seen["KERASTOWER_LOGICAL_DEVICES"] == "3"
        assert json.loads(seen["TF_CONFIG"])["task"]["index"] == i
    # `-X importtime` lists the modules the launcher imported (see also the
    # next test, which looks at the libraries it loaded).
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", stderr, flags=re.M)
    assert "kerastower.workers.launch" in imported
    assert "tensorflow" not in imported and "keras" not in imported


def test_ctrl_c_at_a_terminal_gives_the_workers_sigterm_and_130(tmp_path):
    script, out = write_script(tmp_path, SIGNAL_SCRIPT)
    # Its own process group, to which the signal goes as a terminal sends it.
    proc = start_cli("launch", "-n", "2", script, out, start_new_session=True)
    try:
        assert wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
        maps = Path(f"/proc/{proc.pid}/maps")
        if maps.exists():  # Linux: the launcher has not loaded TensorFlow.
            assert "tensorflow" not in maps.read_text()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "kerastower launch: SIGINT received; stopping the workers" in stderr
    for i in range(2):
        # The workers have their own process groups: they got SIGTERM only.
        assert Path(out, f"signal{i}").read_text() == str(int(signal.SIGTERM))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PDEATHSIG")
def test_workers_get_sigterm_when_the_launcher_is_killed_outright(tmp_path):
    script, out = write_script(tmp_path, SIGNAL_SCRIPT)
    proc = start_cli("launch", "-n", "2", script, out)
    try:
        assert wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
        proc.kill()  # SIGKILL: the launcher cannot stop its workers itself
        proc.communicate(timeout=30)
        signals = [os.path.join(out, f"signal{i}") for i in range(2)]
        assert wait_for(signals, timeout=30)
    finally:
        proc.kill()
    for path in signals:
        assert Path(path).read_text() == str(int(signal.SIGTERM))


def test_command_fails_with_the_first_failed_workers_status(tmp_path):
    script, out = write_script(tmp_path, FAIL_SCRIPT)
    proc = start_cli("launch", "-n", "2", script, out, "0", "5", "no")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 5
    assert "kerastower launch: worker 0 exited with 5; stopped the others" in stderr


def test_hosts_prints_and_exports_the_tf_config():
    hosts = "node0:2222,node1:2222,node2:2222"
    proc = start_cli("launch", "--hosts", hosts, "--index", "2")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout) == launch.tf_config_for(hosts, 2)
    command = (
        f"eval \"$('{sys.executable}' -m kerastower launch --hosts {hosts} "
        '--index 1 --export)" && printf %s "$TF_CONFIG"'
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == launch.tf_config_for(hosts, 1)


def test_signals_to_the_launcher_are_never_restarted(tmp_path):
    script, out = write_script(tmp_path, SIGNAL_SCRIPT)
    proc = start_cli("launch", "-n", "2", "--max-restarts", "3", script, out)
    try:
        assert wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert "restart" not in stderr.replace("--max-restarts", "")


@pytest.mark.slow
def test_a_hung_worker_is_found_by_the_collective_timeout_and_reported():
    # Worker 1 sleeps after train batch 3; worker 0's all-reduce of batch 4
    # times out (10 s), and the launcher says where each one was.
    script = ROOT / "tests" / "workers" / "hanging.py"
    proc = start_cli(
        "launch", "-n", "2", "--towers", "2", "--grace-period", "2", str(script)
    )
    try:
        _, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "DeadlineExceededError" in stderr
    assert "kerastower launch: worker 0 exited with 1; stopped the others" in stderr
    last = "kerastower launch: worker {} was last {} train batch {} of epoch 0, "
    assert re.search(re.escape(last.format(0, "in", 4)) + r"[0-9.]+ s ago", stderr)
    assert re.search(re.escape(last.format(1, "after", 3)) + r"[0-9.]+ s ago", stderr)
