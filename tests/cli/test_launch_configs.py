"""`kerastower launch` without a worker: TF_CONFIG, ports, towers, arguments.

The launcher's plain functions, and the command line's parsing and errors
run in this process.
"""

import re
import socket

import pytest
from worker_scripts import ROOT, write_script

from kerastower.cli import command as cli
from kerastower.cli import launch_command
from kerastower.workers import heartbeats, launch

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
    script, _ = write_script(tmp_path, "raise SystemExit(9)")
    with pytest.raises(ValueError, match=r"`script_argv` must name a script"):
        launch.launch([], 2)
    with pytest.raises(ValueError, match=r"Received: num_workers=0"):
        launch.launch([script], 0)
    with pytest.raises(ValueError, match=r"Received: grace_period=-1"):
        launch.launch([script], 1, grace_period=-1)


# The command line's parsing and errors.


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
    script, _ = write_script(tmp_path, "raise SystemExit(9)")
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


# What the launcher reports and shows.


def test_heartbeats_describe_the_last_record(tmp_path):
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
