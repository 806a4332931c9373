"""`kerastower launch`: TF_CONFIG for each worker, streamed output, failures, signals.

The workers here are tiny plain-Python scripts (no TensorFlow), so each launch
takes a fraction of a second.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kerastower.cli import command as cli
from kerastower.cli import launch_command
from kerastower.workers import group, launch

ROOT = Path(__file__).resolve().parents[2]

# Writes what the worker received to <out>/worker<i>.json.
ENV_SCRIPT = """
import json, os, sys
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
seen = {name: os.environ.get(name) for name in (
    "TF_CONFIG", "KERASTOWER_LOGICAL_DEVICES", "PYTHONUNBUFFERED", "LAUNCH_TEST_MARK")}
seen["argv"] = sys.argv[2:]
seen["modules"] = sorted(m for m in ("tensorflow", "keras") if m in sys.modules)
with open(os.path.join(sys.argv[1], f"worker{i}.json"), "w") as f:
    json.dump(seen, f)
"""

OUTPUT_SCRIPT = """
import json, os, sys
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"out {i} a")
print(f"err {i} a", file=sys.stderr)
print(f"out {i} b")
sys.stdout.write(f"out {i} no newline")
"""

# Worker <failing> exits with <code> once the others are ready; they sleep.
FAIL_SCRIPT = """
import json, os, signal, sys, time
out, failing, code, ignore_term = sys.argv[1:5]
failing, code = int(failing), int(code)
config = json.loads(os.environ["TF_CONFIG"])
i, n = config["task"]["index"], len(config["cluster"]["worker"])
if ignore_term == "yes":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(out, f"ready{i}"), "w").close()
if i == failing:
    while len([p for p in os.listdir(out) if p.startswith("ready")]) < n:
        time.sleep(0.02)
    sys.exit(code)
time.sleep(60)
"""

# Records the signal it gets, after a moment as for a checkpoint, and exits 0.
SIGNAL_SCRIPT = """
import json, os, signal, sys, time
out = sys.argv[1]
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
def stop(signum, frame):
    time.sleep(0.2)
    with open(os.path.join(out, f"signal{i}"), "w") as f:
        f.write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(os.path.join(out, f"ready{i}"), "w").close()
time.sleep(60)
"""


def _script(tmp_path, text, name="worker.py"):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return str(path), str(out)


def _wait_for(paths, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _cli(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-X", "importtime", "-m", "kerastower", *args]
    return subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


# Pure functions.


def test_tf_config_names_every_worker_and_this_task():
    hosts = ["host0:2222", "host1:2223"]
    expected = {
        "cluster": {"worker": hosts},
        "task": {"type": "worker", "index": 1},
    }
    assert launch.tf_config_for(hosts, 1) == expected
    assert launch.tf_config_for(" host0:2222, host1:2223 ", 1) == expected
    assert launch.tf_config_for("[::1]:80", 0)["cluster"]["worker"] == ["[::1]:80"]


@pytest.mark.parametrize(
    "hosts, index, message",
    [
        ([], 0, r"`hosts` must name a worker\. Received: hosts=\[\]"),
        (" , ", 0, r"`hosts` must name a worker"),
        (["host0"], 0, r"`host:port`.*Received: host='host0'"),
        (["host0:x"], 0, r"Received: host='host0:x'"),
        (["host0:0"], 0, r"\[1, 65535\]\. Received: host='host0:0'"),
        (["host0:65536"], 0, r"Received: host='host0:65536'"),
        ([":2222"], 0, r"Received: host=':2222'"),
        (["a:1", "b:1"], 2, r"`index` must be in \[0, 2\).*Received: index=2"),
        (["a:1", "b:1"], -1, r"Received: index=-1"),
        (["a:1"], "0", r"`index` must be an integer\. Received: index='0'"),
    ],
)
def test_tf_config_rejects_bad_hosts_and_indices(hosts, index, message):
    with pytest.raises(ValueError, match=message):
        launch.tf_config_for(hosts, index)


def test_free_loopback_ports_are_distinct_and_free():
    ports = launch.free_loopback_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    with pytest.raises(
        ValueError, match=r"`n` must be an integer >= 1\. Received: n=0"
    ):
        launch.free_loopback_ports(0)


@pytest.mark.parametrize(
    "towers, num_workers, expected",
    [
        ("2", 3, [2, 2, 2]),
        ("2,3", 2, [2, 3]),
        (" 1, 4 ,2", 3, [1, 4, 2]),
        (4, 2, [4, 4]),
        ([3, 1], 2, [3, 1]),
        (None, 2, None),
    ],
)
def test_towers_for_all_or_one_per_worker(towers, num_workers, expected):
    assert launch.towers_per_worker(towers, num_workers) == expected


@pytest.mark.parametrize(
    "towers, num_workers, message",
    [
        ("0", 2, r"`towers` must be an integer >= 1\. Received: towers=0"),
        ("2,0", 2, r"Received: towers=0"),
        ("2,3,4", 2, r"one per worker \(2\)\. Received: towers=\[2, 3, 4\]"),
        ([2], 2, r"one per worker \(2\)\. Received: towers=\[2\]"),
        ("two", 2, r"comma-separated list.*Received: towers='two'"),
        ("2,", 2, r"Received: towers='2,'"),
        ([2.5, 2], 2, r"Received: towers=2\.5"),
        ("2", 0, r"`num_workers` must be an integer >= 1\. Received: num_workers=0"),
    ],
)
def test_bad_towers_are_refused(towers, num_workers, message):
    with pytest.raises(ValueError, match=message):
        launch.towers_per_worker(towers, num_workers)


@pytest.mark.parametrize(
    "argv, launcher, script",
    [
        (["-n", "2", "t.py", "-n", "5"], ["-n", "2"], ["t.py", "-n", "5"]),
        (
            ["--towers", "2,3", "-m", "pkg.train", "--", "-h"],
            ["--towers", "2,3", "-m"],
            ["pkg.train", "--", "-h"],
        ),
        (["-n2", "--grace-period=1", "t.py"], ["-n2", "--grace-period=1"], ["t.py"]),
        (["-n", "2", "--", "-odd.py", "x"], ["-n", "2"], ["-odd.py", "x"]),
        (["--hosts", "a:1", "--index", "0", "--export"], None, []),
    ],
)
def test_the_script_and_its_arguments_are_split_off_untouched(argv, launcher, script):
    assert launch_command.split_argv(argv) == (
        argv if launcher is None else launcher,
        script,
    )


def test_launch_refuses_bad_arguments_before_starting_anything(tmp_path):
    script, _ = _script(tmp_path, "raise SystemExit(9)")
    with pytest.raises(ValueError, match=r"`script_argv` must name a script"):
        launch.launch([], 2)
    with pytest.raises(ValueError, match=r"Received: num_workers=0"):
        launch.launch([script], 0)
    with pytest.raises(ValueError, match=r"Received: grace_period=-1"):
        launch.launch([script], 1, grace_period=-1)


# Workers started by `launch.launch`.


def test_each_worker_gets_its_tf_config_towers_and_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_TEST_MARK", "inherited")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    script, out = _script(tmp_path, ENV_SCRIPT)
    args = ["--epochs", "3", "--", "-n", "5"]
    assert launch.launch([script, out, *args], 2, "2,3") == 0
    seen = [json.loads(Path(out, f"worker{i}.json").read_text()) for i in range(2)]
    configs = [json.loads(s["TF_CONFIG"]) for s in seen]
    hosts = configs[0]["cluster"]["worker"]
    assert len(hosts) == 2 and len(set(hosts)) == 2
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", h) for h in hosts)
    for i, (s, config) in enumerate(zip(seen, configs)):
        assert config == {
            "cluster": {"worker": hosts},
            "task": {"type": "worker", "index": i},
        }
        assert s["KERASTOWER_LOGICAL_DEVICES"] == ["2", "3"][i]
        assert s["PYTHONUNBUFFERED"] == "1"
        assert s["LAUNCH_TEST_MARK"] == "inherited"
        assert s["argv"] == args
        assert s["modules"] == []


def test_without_towers_the_variable_is_left_as_it_is(tmp_path, monkeypatch):
    script, out = _script(tmp_path, ENV_SCRIPT)
    monkeypatch.setenv("KERASTOWER_LOGICAL_DEVICES", "7")
    assert launch.launch([script, out], 1) == 0
    seen = json.loads(Path(out, "worker0.json").read_text())
    assert seen["KERASTOWER_LOGICAL_DEVICES"] == "7"
    monkeypatch.delenv("KERASTOWER_LOGICAL_DEVICES")
    assert launch.launch([script, out], 1) == 0
    seen = json.loads(Path(out, "worker0.json").read_text())
    assert seen["KERASTOWER_LOGICAL_DEVICES"] is None


def test_a_module_runs_as_python_dash_m(tmp_path, monkeypatch):
    _script(tmp_path, ENV_SCRIPT, name="launch_test_worker.py")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = str(tmp_path / "out")
    assert launch.launch(["launch_test_worker", out, "x"], 1, module=True) == 0
    assert json.loads(Path(out, "worker0.json").read_text())["argv"] == ["x"]


def test_output_is_streamed_with_each_workers_prefix(tmp_path, capsys):
    script, _ = _script(tmp_path, OUTPUT_SCRIPT)
    assert launch.launch([script], 2) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    err = [line for line in captured.err.splitlines() if line.startswith("[")]
    for i in range(2):
        mine = [line for line in out if line.startswith(f"[worker {i}] ")]
        assert mine == [
            f"[worker {i}] out {i} a",
            f"[worker {i}] out {i} b",
            f"[worker {i}] out {i} no newline",
        ]
        assert [line for line in err if line.startswith(f"[worker {i}] ")] == [
            f"[worker {i}] err {i} a"
        ]
    assert len(out) == 6 and len(err) == 2
    assert "kerastower launch: starting 2 worker(s) on 127.0.0.1:" in captured.err


def test_the_first_failure_stops_the_others_and_gives_its_status(tmp_path, capsys):
    script, out = _script(tmp_path, FAIL_SCRIPT)
    start = time.monotonic()
    status = launch.launch([script, out, "1", "3", "no"], 3, grace_period=30)
    elapsed = time.monotonic() - start
    assert status == 3
    assert elapsed < 10, elapsed  # the sleeping workers got SIGTERM at once
    err = capsys.readouterr().err
    assert "kerastower launch: worker 1 exited with 3; stopped the others\n" in err


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path, capsys
):
    script, out = _script(tmp_path, FAIL_SCRIPT)
    start = time.monotonic()
    status = launch.launch([script, out, "0", "4", "yes"], 2, grace_period=1)
    elapsed = time.monotonic() - start
    assert status == 4
    assert 1 <= elapsed < 10, elapsed
    err = capsys.readouterr().err
    assert "worker 0 exited with 4; stopped the others (killed worker 1)" in err


class _EndsBetweenPolls:
    """A worker that is still running at its first poll and dead by SIGKILL after."""

    def __init__(self):
        self.polls = 0
        self.returncode = None

    def poll(self):
        self.polls += 1
        if self.polls > 1:
            self.returncode = -9
        return self.returncode

    def wait(self):
        return self.poll()


def test_a_worker_that_ends_between_two_polls_is_not_taken_for_a_success(capsys):
    # CI once saw status 0 for a SIGKILLed worker: it died between the poll
    # that looks for failures and the one that looks for running workers.
    workers = group.WorkerGroup()
    workers.track(_EndsBetweenPolls())
    assert workers.wait(grace_period=1, signals=[]) == 128 + 9
    assert "worker 0 was killed by SIGKILL" in capsys.readouterr().err


def test_a_worker_killed_by_a_signal_gives_128_plus_the_signal(tmp_path, capsys):
    script, _ = _script(tmp_path, "import os, signal\nos.kill(os.getpid(), 9)\n")
    assert launch.launch([script], 1) == 128 + 9
    assert (
        "kerastower launch: worker 0 was killed by SIGKILL" in capsys.readouterr().err
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_reaches_the_workers_as_sigterm(tmp_path, sig):
    script, out = _script(tmp_path, SIGNAL_SCRIPT)
    ready = [os.path.join(out, f"ready{i}") for i in range(2)]
    sender = threading.Thread(
        target=lambda: _wait_for(ready) and os.kill(os.getpid(), sig), daemon=True
    )
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sender.start()
    assert launch.launch([script, out], 2, grace_period=20) == 128 + sig
    sender.join()
    assert handlers == {s: signal.getsignal(s) for s in handlers}
    for i in range(2):
        assert Path(out, f"signal{i}").read_text() == str(int(signal.SIGTERM))


# The command line, end to end.


def test_command_passes_the_script_its_arguments_without_loading_tensorflow(
    tmp_path,
):
    script, out = _script(tmp_path, ENV_SCRIPT)
    args = ["-n", "5", "--towers", "x", "--", "-h"]
    proc = _cli("launch", "-n", "2", "--towers", "3", script, out, *args)
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
    script, out = _script(tmp_path, SIGNAL_SCRIPT)
    # Its own process group, to which the signal goes as a terminal sends it.
    proc = _cli("launch", "-n", "2", script, out, start_new_session=True)
    try:
        assert _wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
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
    script, out = _script(tmp_path, SIGNAL_SCRIPT)
    proc = _cli("launch", "-n", "2", script, out)
    try:
        assert _wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
        proc.kill()  # SIGKILL: the launcher cannot stop its workers itself
        proc.communicate(timeout=30)
        signals = [os.path.join(out, f"signal{i}") for i in range(2)]
        assert _wait_for(signals, timeout=30)
    finally:
        proc.kill()
    for path in signals:
        assert Path(path).read_text() == str(int(signal.SIGTERM))


def test_command_fails_with_the_first_failed_workers_status(tmp_path):
    script, out = _script(tmp_path, FAIL_SCRIPT)
    proc = _cli("launch", "-n", "2", script, out, "0", "5", "no")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 5
    assert "kerastower launch: worker 0 exited with 5; stopped the others" in stderr


def test_hosts_prints_and_exports_the_tf_config():
    hosts = "node0:2222,node1:2222,node2:2222"
    proc = _cli("launch", "--hosts", hosts, "--index", "2")
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


def test_export_quotes_for_the_shell(capsys):
    assert cli.main(["launch", "--hosts", "a:1", "--index", "0", "--export"]) == 0
    config = '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
    assert capsys.readouterr().out == f"export TF_CONFIG='{config}'\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "SCRIPT"], r"`-n` must be an integer >= 1\. Received: -n=0"),
        (
            ["-n", "2", "--towers", "2,3,4", "SCRIPT"],
            r"`--towers` must .* Received: --towers=\[2, 3, 4\]",
        ),
        (["-n", "2", "missing.py"], r"Received: script='missing.py'"),
        (["SCRIPT"], r"`-n` and a script are required"),
        (["-n", "2"], r"`-n` and a script are required"),
        (["--hosts", "a:1"], r"`--index` is required with `--hosts`"),
        (["--hosts", "a:1", "--index", "0", "SCRIPT"], r"starts nothing"),
        (["--hosts", "a:1", "--index", "1"], r"`--index` must .* Received: --index=1"),
        (["-n", "1", "--grace-period", "-1", "SCRIPT"], r"--grace-period=-1"),
        ([], r"or `--hosts` and `--index`"),
        (["--hosts", "a", "--index", "0"], r"Received: host='a'"),
        (["--index", "0", "-n", "1", "SCRIPT"], r"go with `--hosts`"),
    ],
)
def test_usage_errors_exit_2_with_a_message(tmp_path, capsys, argv, message):
    script, _ = _script(tmp_path, "raise SystemExit(9)")
    argv = [script if a == "SCRIPT" else a for a in argv]
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kerastower launch: error: ")
    assert re.search(message, err), err


def test_an_unknown_flag_names_the_closest_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["launch", "--workers", "2", "script.py"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: kerastower launch")
    assert "unrecognized arguments: --workers (did you mean --num-workers?)\n" in err


# Worker 1 fails with status argv[2], once worker 0 has started too, until
# the launcher has restarted the workers argv[3] times; every start leaves a
# file <out>/start<worker>_<restarts>.
RESTART_SCRIPT = """
import json, os, sys, time
i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
restarts = int(os.environ["KERASTOWER_RESTART_COUNT"])
open(os.path.join(sys.argv[1], f"start{i}_{restarts}"), "w").close()
if i == 1 and restarts < int(sys.argv[3]):
    while not os.path.exists(os.path.join(sys.argv[1], f"start0_{restarts}")):
        time.sleep(0.01)
    sys.exit(int(sys.argv[2]))
"""


def _starts(out):
    return sorted(p.name for p in Path(out).glob("start*"))


@pytest.mark.parametrize(
    "status, fails, flags, expected, restarts",
    [
        (3, 2, ["--max-restarts", "2"], 0, 2),  # the third start succeeds
        (3, 5, ["--max-restarts", "2"], 3, 2),  # out of restarts: its status
        (3, 1, [], 3, 0),  # no restart unless asked
        (143, 1, ["--max-restarts", "2"], 143, 0),  # preempted: not a failure
        (143, 1, ["--max-restarts", "2", "--restart-preempted"], 0, 1),
    ],
)
def test_max_restarts_starts_every_worker_again_after_a_failure(
    tmp_path, capsys, status, fails, flags, expected, restarts
):
    script, out = _script(tmp_path, RESTART_SCRIPT)
    argv = ["launch", "-n", "2", *flags, script, out, str(status), str(fails)]
    assert cli.main(argv) == expected
    starts = [f"start{i}_{r}" for r in range(restarts + 1) for i in (0, 1)]
    assert _starts(out) == sorted(starts)
    err = capsys.readouterr().err
    assert err.count("kerastower launch: starting 2 worker(s)") == restarts + 1
    for r in range(restarts):
        assert f"after exit status {status} (restart {r + 1} of 2)" in err
    if status == 143 and not restarts:
        assert "kerastower launch: a worker was preempted (143): not restarting" in err


def test_signals_to_the_launcher_are_never_restarted(tmp_path):
    script, out = _script(tmp_path, SIGNAL_SCRIPT)
    proc = _cli("launch", "-n", "2", "--max-restarts", "3", script, out)
    try:
        assert _wait_for([os.path.join(out, f"ready{i}") for i in range(2)])
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert "restart" not in stderr.replace("--max-restarts", "")


# The workers write their TF_CONFIG's task; the evaluator waits for the file
# that tells it the workers have finished, then writes what it saw.
EVALUATOR_SCRIPT = """
import json, os, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
name = f"{task['type']}{task['index']}"
if task["type"] == "evaluator":
    done = os.environ["KERASTOWER_TRAINING_DONE_FILE"]
    while not os.path.exists(done):
        time.sleep(0.01)
    print("training has ended")
with open(os.path.join(sys.argv[1], name + ".json"), "w") as f:
    json.dump(config["cluster"], f)
"""


def test_the_evaluator_runs_beside_the_workers_until_they_finish(tmp_path, capsys):
    script, out = _script(tmp_path, EVALUATOR_SCRIPT)
    assert cli.main(["launch", "-n", "2", "--evaluator", script, out]) == 0
    captured = capsys.readouterr()
    assert "[evaluator] training has ended" in captured.out
    assert ", and the evaluator on 127.0.0.1:" in captured.err
    clusters = {
        name: json.loads(Path(out, f"{name}.json").read_text())
        for name in ("worker0", "worker1", "evaluator0")
    }
    assert len({json.dumps(c, sort_keys=True) for c in clusters.values()}) == 1
    assert len(clusters["evaluator0"]["worker"]) == 2
    assert len(clusters["evaluator0"]["evaluator"]) == 1


@pytest.mark.slow
def test_a_hung_worker_is_found_by_the_collective_timeout_and_reported():
    # Worker 1 sleeps after train batch 3; worker 0's all-reduce of batch 4
    # times out (10 s), and the launcher says where each one was.
    script = ROOT / "tests" / "workers" / "hanging.py"
    proc = _cli(
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


def test_heartbeats_describe_the_last_record(tmp_path):
    from kerastower.workers import heartbeats

    path = str(tmp_path / "beat")
    assert heartbeats.describe(path) is None  # no file yet
    record = heartbeats._Record(path)
    assert heartbeats.describe(path) is None  # no record yet
    record.write(phase="test", state="begin", epoch=2, batch=7, time=100.0)
    assert heartbeats.describe(path, now=112.34) == (
        "in test batch 7 of epoch 2, 12.3 s ago"
    )


def test_the_documented_usage_is_the_parsers():
    page = (ROOT / "docs" / "api" / "launch.md").read_text()
    usage = "usage: " + launch_command.USAGE % {"prog": "kerastower launch"}
    assert usage in page, (
        f"docs/api/launch.md shows another usage of `kerastower launch`:\n{usage}"
    )
