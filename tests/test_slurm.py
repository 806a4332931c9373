"""Slurm: each task's TF_CONFIG and GPUs, against TensorFlow's SlurmClusterResolver.

`kerastower.workers.slurm.slurm_task` reads the variables `srun` sets in each task;
the resolver, constructed on the same (faked) environment, is the oracle.
`kerastower launch --slurm` is run end to end on a faked task with tiny
plain-Python scripts.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from kerastower.cli import command as cli
from kerastower.workers import launch
from kerastower.workers.slurm import expand_hostlist, expand_tasks_per_node, slurm_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch):
    """A test's environment starts with no Slurm variable and no GPU choice."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SLURMD_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)


def slurm_environment(nodelist, tasks_per_node, hosts, counts, rank):
    """What `srun` sets in task `rank`, placed by the block distribution.

    `hosts` and `counts` are `nodelist` and `tasks_per_node` expanded by hand.
    """
    tasks = [(host, i) for host, count in zip(hosts, counts) for i in range(count)]
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_NUM_TASKS": str(len(tasks)),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURMD_NODENAME": tasks[rank][0],
        "SLURM_LOCALID": str(tasks[rank][1]),
    }


def resolver_answer(counts, port_base, gpus_per_task):
    """`SlurmClusterResolver`'s TF_CONFIG and CUDA_VISIBLE_DEVICES, from os.environ."""
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base,
        # Given, so that it does not run nvidia-smi.
        gpus_per_node=max(counts) * (gpus_per_task or 1),
        gpus_per_task=gpus_per_task or 1,
        auto_set_gpu=gpus_per_task is not None,
    )
    spec = resolver.cluster_spec()
    task_type, task_id = resolver.get_task_info()
    config = {"cluster": spec.as_dict(), "task": {"type": task_type, "index": task_id}}
    return config, os.environ.get("CUDA_VISIBLE_DEVICES")


# (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, its nodes, their tasks)
CLUSTERS = {
    "2 nodes x 2 tasks": ("node[01-02]", "2(x2)", ["node01", "node02"], [2, 2]),
    "uneven 2(x1),1": ("gpu-a,gpu-b", "2(x1),1", ["gpu-a", "gpu-b"], [2, 1]),
    "brackets": (
        "cn[1-2],node[01-03,7]",
        "3,1(x2),2(x2),1",
        ["cn1", "cn2", "node01", "node02", "node03", "node7"],
        [3, 1, 1, 2, 2, 1],
    ),
    "1 node x 1 task": ("localhost", "1", ["localhost"], [1]),
}


@pytest.mark.parametrize("gpus_from", ["argument", "SLURM_GPUS_PER_TASK", None])
@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_every_task_gets_what_slurm_cluster_resolver_gives(
    monkeypatch, cluster, gpus_from
):
    nodelist, tasks_per_node, hosts, counts = cluster
    gpus = None if gpus_from is None else 2
    port_base = 8888 if gpus_from is None else 9100
    addresses = []
    for rank in range(sum(counts)):
        environ = slurm_environment(nodelist, tasks_per_node, hosts, counts, rank)
        if gpus_from == "SLURM_GPUS_PER_TASK":
            environ["SLURM_GPUS_PER_TASK"] = "a100:2"
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

        ours = slurm_task(
            environ,
            port_base=port_base,
            gpus_per_task=gpus if gpus_from == "argument" else None,
        )
        expected = resolver_answer(counts, port_base, gpus)
        assert (ours.tf_config, ours.cuda_visible_devices) == expected
        # What TensorFlow reads back from the TF_CONFIG is the same cluster.
        monkeypatch.setenv("TF_CONFIG", json.dumps(ours.tf_config))
        read_back = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert read_back.cluster_spec().as_dict() == expected[0]["cluster"]
        assert (read_back.task_type, read_back.task_id) == ("worker", rank)
        addresses.append(ours.tf_config["cluster"]["worker"][rank])
    # Each task's own address is on its own node, one port per task there.
    assert addresses == [
        f"{host}:{port_base + i}" for host, n in zip(hosts, counts) for i in range(n)
    ]


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node02,gpu-a", ["node02", "gpu-a"]),
    ],
)
def test_workers_follow_slurms_node_order_where_the_resolver_sorts_names(
    monkeypatch, nodelist, hosts
):
    # Slurm's block distribution puts task 0 on the first node of the list;
    # the resolver sorts the names ("node10" < "node8"), which gives task 0
    # another node's address. The tasks are the same, in another order.
    for rank, host in enumerate(hosts):
        environ = slurm_environment(
            nodelist, f"1(x{len(hosts)})", hosts, [1] * len(hosts), rank
        )
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        ours = slurm_task(environ)
        workers = ours.tf_config["cluster"]["worker"]
        assert workers == [f"{h}:8888" for h in hosts]
        assert workers[rank] == f"{host}:8888"
        resolver_config, _ = resolver_answer([1] * len(hosts), 8888, None)
        assert resolver_config["cluster"]["worker"] == sorted(workers)
        assert resolver_config["cluster"]["worker"] != workers


@pytest.mark.parametrize(
    "hostlist, expected",
    [
        ("n[1-2],m5,o[3-4,6,7-9]", "n1 n2 m5 o3 o4 o6 o7 o8 o9"),
        ("node[01-03,7],gpu-a", "node01 node02 node03 node7 gpu-a"),
        ("node[8-10]", "node8 node9 node10"),
        ("x[098-100]", "x098 x099 x100"),
        ("n[1-2]-ib,login.example.org", "n1-ib n2-ib login.example.org"),
        (" 127.0.0.1 ", "127.0.0.1"),
    ],
)
def test_host_lists_expand_in_order(hostlist, expected):
    assert expand_hostlist(hostlist) == expected.split()


def test_tasks_per_node_expand_in_order():
    assert expand_tasks_per_node("3(x2),2,1") == [3, 3, 2, 1]
    assert expand_tasks_per_node("4") == [4]


@pytest.mark.parametrize(
    "hostlist", ["", "n[1-", "n]", "a,,b", "n[3-1]", "n[[1]]", "n[a]"]
)
def test_bad_host_lists_are_refused(hostlist):
    received = re.escape(repr(hostlist))
    message = rf"`hostlist` must be a Slurm host list .* Received: hostlist={received}"
    with pytest.raises(ValueError, match=message):
        expand_hostlist(hostlist)


@pytest.mark.parametrize("text", ["", "2(x)", "2x2", "0", "2(x0)", "two"])
def test_bad_tasks_per_node_are_refused(text):
    with pytest.raises(
        ValueError, match=rf"Received: tasks_per_node='{re.escape(text)}'"
    ):
        expand_tasks_per_node(text)


GOOD = slurm_environment("node[01-02]", "2(x2)", ["node01", "node02"], [2, 2], 3)


@pytest.mark.parametrize(
    "changes, kwargs, message",
    [
        (
            {"SLURM_PROCID": None},
            {},
            r"`SLURM_PROCID` must be set, as `srun` sets it .* "
            r"Received: SLURM_PROCID not set",
        ),
        ({"SLURM_STEP_NODELIST": None}, {}, r"Received: SLURM_STEP_NODELIST not set"),
        ({"SLURM_STEP_NUM_TASKS": None}, {}, r"Received: SLURM_STEP_NUM_TASKS not set"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": None},
            {},
            r"Received: SLURM_STEP_TASKS_PER_NODE not set",
        ),
        (
            {"SLURM_PROCID": "x"},
            {},
            r"`SLURM_PROCID` must be an integer >= 0\. Received: SLURM_PROCID='x'",
        ),
        (
            {"SLURM_PROCID": "4"},
            {},
            r"`SLURM_PROCID` must be in \[0, 4\).* Received: SLURM_PROCID=4",
        ),
        (
            {"SLURM_STEP_NODELIST": "node[01-02"},
            {},
            r"`SLURM_STEP_NODELIST` must be a Slurm host list .* "
            r"Received: SLURM_STEP_NODELIST='node\[01-02'",
        ),
        (
            {"SLURM_STEP_NODELIST": "node[01-02],node01"},
            {},
            r"names each node once\. "
            r"Received: SLURM_STEP_NODELIST='node\[01-02\],node01'",
        ),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "2x2"},
            {},
            r"`SLURM_STEP_TASKS_PER_NODE` must be a Slurm task count list .* "
            r"Received: SLURM_STEP_TASKS_PER_NODE='2x2'",
        ),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NUM_TASKS": "6"},
            {},
            r"one task count per node of SLURM_STEP_NODELIST \(2\)\. "
            r"Received: SLURM_STEP_TASKS_PER_NODE='2\(x3\)'",
        ),
        (
            {"SLURM_STEP_NUM_TASKS": "3"},
            {},
            r"`SLURM_STEP_NUM_TASKS` must be the number of tasks that "
            r"SLURM_STEP_TASKS_PER_NODE='2\(x2\)' gives \(4\)\. "
            r"Received: SLURM_STEP_NUM_TASKS=3",
        ),
        (
            {"SLURM_GPUS_PER_TASK": "many"},
            {},
            r"`SLURM_GPUS_PER_TASK` must be a number of GPUs >= 1.* "
            r"Received: SLURM_GPUS_PER_TASK='many'",
        ),
        (
            {},
            {"gpus_per_task": 0},
            r"`gpus_per_task` must be an integer >= 1\. Received: gpus_per_task=0",
        ),
        (
            {},
            {"port_base": 65535},
            r"`port_base` must be an integer in \[1, 65534\] for 2 task\(s\) on a "
            r"node, one port each\. Received: port_base=65535",
        ),
        ({}, {"port_base": 0}, r"Received: port_base=0"),
        ({}, {"port_base": "8888"}, r"Received: port_base='8888'"),
        (
            {"SLURMD_NODENAME": "node01"},
            {},
            r"`SLURMD_NODENAME` must be 'node02', the node on which Slurm's block "
            r"distribution puts task SLURM_PROCID=3: start the tasks with "
            r"`srun --distribution=block`.* Received: SLURMD_NODENAME='node01'",
        ),
        (
            {"SLURM_LOCALID": "0"},
            {},
            r"`SLURM_LOCALID` must be 1, .* Received: SLURM_LOCALID='0'",
        ),
    ],
)
def test_bad_environments_are_refused_naming_the_variable(changes, kwargs, message):
    environ = {**GOOD, **changes}
    environ = {name: value for name, value in environ.items() if value is not None}
    with pytest.raises(ValueError, match=message):
        slurm_task(environ, **kwargs)


# `kerastower launch --slurm`, end to end.

# Prints what the worker received, then exits with the status it is given.
PRINT_SCRIPT = """
import json, os, sys
seen = {name: os.environ.get(name) for name in (
    "TF_CONFIG", "CUDA_VISIBLE_DEVICES", "KERASTOWER_LOGICAL_DEVICES")}
seen["argv"] = sys.argv[1:]
seen["modules"] = sorted(m for m in ("tensorflow", "keras") if m in sys.modules)
print(json.dumps(seen))
sys.exit(int(sys.argv[1]))
"""

# On SIGTERM, records it and exits with 7, as after a checkpoint.
SIGNAL_SCRIPT = """
import os, signal, sys, time
out = sys.argv[1]
def stop(signum, frame):
    with open(os.path.join(out, "signal"), "w") as f:
        f.write(str(signum))
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(out, "ready"), "w").close()
time.sleep(60)
"""


# `-X importtime` lists the modules the launcher imported.
LAUNCH = [sys.executable, "-X", "importtime", "-m", "kerastower", "launch"]


def _with_path(environ):
    """This process's environment, the package importable, plus `environ`."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **environ}


def _launch(args, environ):
    return subprocess.run(
        [*LAUNCH, *args],
        env=_with_path(environ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_one_task_runs_its_worker_with_its_tf_config_and_status(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(PRINT_SCRIPT)
    port = launch.free_loopback_ports(1)[0]
    environ = slurm_environment("127.0.0.1", "1", ["127.0.0.1"], [1], 0)
    args = ["--slurm", "--port-base", str(port), "--gpus-per-task", "2", str(script)]
    result = _launch([*args, "5", "--", "-n", "2"], environ)
    stderr = result.stderr
    assert result.returncode == 5, stderr
    seen = json.loads(result.stdout)
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": {"worker": [f"127.0.0.1:{port}"]},
        "task": {"type": "worker", "index": 0},
    }
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert seen["argv"] == ["5", "--", "-n", "2"]
    assert seen["modules"] == []
    assert (
        f"kerastower launch: starting worker 0 of 1 on 127.0.0.1:{port} "
        "(CUDA_VISIBLE_DEVICES=0,1)\n"
    ) in stderr
    assert "kerastower launch: worker 0 exited with 5\n" in stderr
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", stderr, flags=re.M)
    assert "kerastower.workers.slurm" in imported
    assert "tensorflow" not in imported and "keras" not in imported


def test_two_tasks_on_a_node_get_one_cluster_and_a_gpu_and_towers_each(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(PRINT_SCRIPT)
    seen = []
    for rank in range(2):
        environ = slurm_environment("localhost", "2", ["localhost"], [2], rank)
        environ["SLURM_GPUS_PER_TASK"] = "1"
        result = _launch(["--slurm", "--towers", "2,3", str(script), "0"], environ)
        assert result.returncode == 0, result.stderr
        seen.append(json.loads(result.stdout))
    for rank, s in enumerate(seen):
        assert json.loads(s["TF_CONFIG"]) == {
            "cluster": {"worker": ["localhost:8888", "localhost:8889"]},
            "task": {"type": "worker", "index": rank},
        }
        assert s["CUDA_VISIBLE_DEVICES"] == str(rank)
        assert s["KERASTOWER_LOGICAL_DEVICES"] == ["2", "3"][rank]


def test_sigterm_reaches_the_worker_and_its_status_is_the_launchers(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SIGNAL_SCRIPT)
    environ = slurm_environment("localhost", "1", ["localhost"], [1], 0)
    proc = subprocess.Popen(
        [*LAUNCH, "--slurm", str(script), str(tmp_path)],
        env=_with_path(environ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 7, stderr
    assert (tmp_path / "signal").read_text() == str(int(signal.SIGTERM))
    assert "kerastower launch: SIGTERM received; stopping the workers" in stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slurm", "-n", "2", "SCRIPT"], r"`--slurm` .*leave out `-n` and `--hosts`"),
        (
            ["--slurm", "--hosts", "a:1", "--index", "0"],
            r"`--slurm` .*leave out `-n` and `--hosts`",
        ),
        (["-n", "1", "--port-base", "9000", "SCRIPT"], r"go with `--slurm`"),
        (["-n", "1", "--gpus-per-task", "1", "SCRIPT"], r"go with `--slurm`"),
        (["--slurm"], r"`--slurm` needs a script"),
        (["--slurm", "--index", "0", "SCRIPT"], r"go with `--hosts`"),
        (["--slurm", "missing.py"], r"Received: script='missing.py'"),
        (["--slurm", "SCRIPT"], r"Received: SLURM_STEP_NODELIST not set"),
        (
            ["--slurm", "--gpus-per-task", "0", "SCRIPT", "SLURM"],
            r"`--gpus-per-task` must be an integer >= 1\. Received: --gpus-per-task=0",
        ),
        (
            ["--slurm", "--port-base", "0", "SCRIPT", "SLURM"],
            r"`--port-base` must be an integer in \[1, 65535\] .* "
            r"Received: --port-base=0",
        ),
        (
            ["--slurm", "--towers", "2,3", "SCRIPT", "SLURM"],
            r"one per worker \(1\)\. Received: --towers=\[2, 3\]",
        ),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    tmp_path, monkeypatch, capsys, argv, message
):
    script = tmp_path / "worker.py"
    script.write_text("raise SystemExit(9)")
    if "SLURM" in argv:
        argv = argv[:-1]
        for name, value in slurm_environment("n1", "1", ["n1"], [1], 0).items():
            monkeypatch.setenv(name, value)
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kerastower launch: error: ")
    assert re.search(message, err), err
