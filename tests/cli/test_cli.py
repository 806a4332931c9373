"""The `kerastower` command: the README's demo and the device listing."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import checkout_env

from kerastower import _startup
from kerastower.cli import command as cli
from kerastower.cli.demo import DemoResult, format_report, load_digits
from kerastower.testing import Comparison
from kerastower.testing.comparison import DEFAULT_TOLERANCE

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=240):
    env = checkout_env(TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_demo_trains_over_towers_and_matches_one_device(tmp_path):
    result = run(
        sys.executable,
        "-m",
        "kerastower",
        "demo",
        "--towers",
        "3",
        "--batch-size",
        "40",
        "--epochs",
        "1",
        "--log-dir",
        str(tmp_path),
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "36/36" in out  # Keras's progress bar: 36 steps
    assert "3 x logical CPU" in out
    # 1,437 training images: 35 batches of 40 = [14, 13, 13], one of 37.
    assert "global batch 40 -> per tower [14, 13, 13]" in out
    assert "last batch of each epoch 37 -> per tower [13, 12, 12]" in out
    assert "examples per tower per epoch: [503, 467, 467]" in out
    accuracy = re.search(r"Accuracy +train ([0-9.]+), test ([0-9.]+)", out)
    assert accuracy and float(accuracy.group(2)) > 0.5
    # The verdict is the float64 run's, rounding on any machine; the float32
    # run is only reported beside its yardstick, whose size is the CPU's.
    difference = re.search(r"float64: towers (\S+) from one device", out)
    assert difference, out
    assert float(difference.group(1)) < 1e-10
    assert re.search(r"float32: towers \S+ from one device; one device fed", out)
    assert "same model as one device" in out
    assert f"tensorboard --logdir {tmp_path}" in out
    assert list((tmp_path / "towers").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (tmp_path / "towers").glob("tower_*")) == [
        "tower_0",
        "tower_1",
        "tower_2",
    ]


def _measured_as_n(report: str) -> list[str]:
    """The report's lines, with times, accuracies and the difference as N."""
    measured = ("Accuracy", "Time", "one device:", "Exactness", "float32:")
    return [
        re.sub(r"\d+\.\d+(e[-+]\d+)?", "N", line)
        if line.strip().startswith(measured)
        else line.rstrip()
        for line in report.strip().splitlines()
    ]


def test_the_readme_demo_command_is_exact_and_prints_the_documented_report():
    # `kerastower demo` as the README pastes it: 4 towers, batches of 30 cut
    # [8, 8, 7, 7] and a last one of 27, three epochs of Adam.
    result = run(sys.executable, "-m", "kerastower", "demo")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Epoch 3/3" in out
    difference = re.search(r"float64: towers (\S+) from one device", out)
    assert difference, out
    assert float(difference.group(1)) < 1e-10
    report = out[out.index("kerastower demo: a small convnet") :]
    documented = (ROOT / "docs" / "snippets" / "demo.txt").read_text()
    assert _measured_as_n(report) == _measured_as_n(documented), (
        "docs/snippets/demo.txt (the Quickstart's demo output) no longer "
        f"matches the demo's report; replace it with:\n{report}"
    )


def test_devices_lists_the_towers():
    result = run(sys.executable, "-m", "kerastower", "devices", "--towers", "3")
    assert result.returncode == 0, result.stderr
    assert "TowerModel(towers=3) would use 3 logical CPUs" in result.stdout
    for i in range(3):
        assert f"tower {i}  /device:CPU:{i}" in result.stdout


def test_console_script_lists_the_devices():
    script = Path(sys.executable).with_name("kerastower")
    if not script.exists():
        pytest.skip(
            "the `kerastower` console script is not installed (pip install -e .)"
        )
    result = run(str(script), "devices")
    assert result.returncode == 0, result.stderr
    assert "TowerModel(towers=1) would use 1 CPU" in result.stdout
    assert "  tower 0  /device:CPU:0" in result.stdout


def test_the_command_starts_quietly_unless_verbose():
    # TensorFlow's C++ start-up lines (oneDNN, CPU features, absl) go to the
    # process's stderr at import; the command's first line is its own.
    env = checkout_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    command = [sys.executable, "-m", "kerastower", "devices"]
    quiet = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert quiet.stdout.startswith("kerastower "), quiet.stdout
    verbose = subprocess.run(
        [*command, "--verbose"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stdout == quiet.stdout


def test_version_names_kerastower_tensorflow_and_keras(capsys):
    import keras
    import tensorflow as tf

    import kerastower

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"kerastower {kerastower.__version__} (TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__})"
    )


@pytest.mark.parametrize(
    "argv0, orig_argv, script, expected",
    [
        ("/usr/bin/kerastower", ["python", "/usr/bin/kerastower", "demo"], True, True),
        ("C:\\venv\\Scripts\\kerastower.exe", ["kerastower.exe"], True, True),
        ("-m", ["python", "-m", "kerastower", "devices"], False, True),
        ("-m", ["python", "-X", "dev", "-m", "kerastower.cli"], False, True),
        ("train.py", ["python", "train.py"], False, False),
        ("-m", ["python", "-m", "pytest"], False, False),
        # A program's own `sys.argv` says nothing.
        ("/usr/bin/kerastower", ["python", "/usr/bin/kerastower"], False, False),
        ("kerastower", ["python", "-c", "..."], False, False),
    ],
)
def test_only_the_command_line_is_quieted(
    monkeypatch, argv0, orig_argv, script, expected
):
    import kerastower_command

    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys, "orig_argv", orig_argv, raising=False)
    monkeypatch.setattr(kerastower_command, "STARTED", script)
    assert _startup.started_as_command() is expected


def test_a_program_named_kerastower_imports_the_whole_package():
    # Its `sys.argv[0]` is the console script's name, and it is not the
    # command line: `import kerastower` gives it the model.
    program = (
        "import sys; sys.argv[0] = '/usr/bin/kerastower'; import kerastower; "
        "print(kerastower.TowerModel.__name__)"
    )
    result = run(sys.executable, "-c", program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "TowerModel"


def test_verbose_is_accepted_before_and_after_the_command():
    parser = cli._parser()
    assert parser.parse_args(["--verbose", "devices"]).verbose
    assert parser.parse_args(["demo", "--verbose"]).verbose
    assert not parser.parse_args(["devices"]).verbose


class _FakeConfig:
    """Stands in for `tf.config` on a machine with two GPUs."""

    def __init__(self, memory):
        self.memory = memory
        self.experimental = self

    def list_physical_devices(self, kind):
        return ["gpu0", "gpu1"] if kind == "GPU" else ["cpu0"]

    def get_device_details(self, device):
        if device == "gpu1":
            raise ValueError("no details")
        return {"device_name": "NVIDIA H100", "compute_capability": (9, 0)}

    def get_memory_info(self, name):
        if self.memory is None:
            raise ValueError("memory info is not supported")
        return self.memory


def test_gpu_details_show_what_tensorflow_reports():
    import tensorflow as tf

    fake = type("tf", (), {"DeviceSpec": tf.DeviceSpec})()
    fake.config = _FakeConfig({"current": 3 * 2**20, "peak": 5 * 2**20})
    assert cli._gpu_details(fake, "/device:GPU:0") == (
        "NVIDIA H100, compute capability 9.0, memory in use 3 MiB (peak 5 MiB)"
    )
    assert cli._gpu_details(fake, "/device:GPU:1") == (
        "memory in use 3 MiB (peak 5 MiB)"
    )
    fake.config = _FakeConfig(None)
    assert cli._gpu_details(fake, "/device:GPU:1") == ""


def test_usage_errors():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--towers", "0"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["demo", "--epochs", "two"])
    for tolerance in ("-1", "0", "nan", "inf", "x"):
        with pytest.raises(SystemExit):
            cli.main(["demo", "--tolerance", tolerance])


def test_an_unwritable_log_dir_is_refused_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["demo", "--log-dir", str(blocker / "logs")]) == 2
    err = capsys.readouterr().err
    assert "kerastower demo: error: `--log-dir` must be a directory" in err


def test_each_command_says_its_own_default_towers(capsys):
    for command, default in (("demo", "4 logical CPUs"), ("devices", "the one CPU")):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert f"without a GPU, {default})" in help_text
    with pytest.raises(SystemExit):
        cli.main(["demo", "--epocs", "2"])
    assert "(did you mean --epochs?)" in capsys.readouterr().err


def _comparison(dtype, weights, yardstick=None):
    return Comparison(
        dtype=dtype,
        towers=["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"],
        steps=3,
        weights=weights,
        worst_weight="dense/kernel",
        weights_absolute=weights,
        history=0.0,
        predictions=0.0,
        yardstick=yardstick,
        tolerance=DEFAULT_TOLERANCE[dtype],
        seconds={"towers": 1.0, "one_device": 0.5},
        tower_model=None,
        one_device_model=None,
    )


def _demo_result(float32, float64):
    return DemoResult(
        devices=["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"],
        train_examples=23,
        test_examples=5,
        batch_size=10,
        epoch_seconds=[1.0],
        one_device_seconds=0.5,
        tower_examples=[9, 7, 7],
        train_accuracy=0.5,
        test_accuracy=0.4,
        one_device_test_accuracy=0.4,
        float32=float32,
        float64=float64,
    )


def test_report_reads_float32_rounding_against_its_yardstick():
    # A machine whose float32 rounding sends Adam 3e-2 away (measured on a
    # 2-core AMD EPYC with AVX2): the float64 run decides, and says the same.
    result = _demo_result(
        _comparison("float32", 3.1e-2, yardstick=1.0e-2), _comparison("float64", 1e-14)
    )
    report = format_report(result)
    assert result.exact
    assert "global batch 10 -> per tower [4, 3, 3]" in report
    assert "last batch of each epoch 3 -> per tower [1, 1, 1]" in report
    assert "float64: towers 1.0e-14 from one device (relative): same model" in report
    assert "float32: towers 3.1e-02 from one device; one device fed each batch " in (
        report
    )
    assert "reordered: 1.0e-02" in report


def test_report_flags_a_run_that_is_not_exact():
    result = _demo_result(
        _comparison("float32", 3e-2, yardstick=1e-7), _comparison("float64", 3e-2)
    )
    report = format_report(result)
    assert not result.exact
    assert "float64: towers 3.0e-02 from one device (relative): DIFFERENT" in report
    assert "(more than 1e-10)" in report


def test_the_shipped_digits_are_scikit_learns():
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    (x, y), (x_test, y_test) = load_digits(seed=0)
    order = np.random.default_rng(0).permutation(len(digits.target))
    np.testing.assert_array_equal(
        np.concatenate([x, x_test])[..., 0] * 16.0, digits.images[order]
    )
    np.testing.assert_array_equal(np.concatenate([y, y_test]), digits.target[order])


@pytest.mark.parametrize(
    "argv, status",
    [
        (["--help"], 0),
        (["demo", "--help"], 0),
        (["launch", "--help"], 0),
        (["demo", "--tolerance", "-1"], 2),
        (["launch", "--workers", "0"], 2),
    ],
)
def test_help_and_usage_errors_answer_without_tensorflow(argv, status):
    # What keeps `kerastower --help` well under a second: `-X importtime`
    # lists every module the command imported.
    result = run(sys.executable, "-X", "importtime", "-m", "kerastower", *argv)
    assert result.returncode == status, result.stderr
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", result.stderr, flags=re.M)
    assert "kerastower.cli.command" in imported
    assert "tensorflow" not in imported and "keras" not in imported


def _no_gpu():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")


@pytest.mark.parametrize("command", ["devices", "demo"])
def test_device_gpu_without_a_gpu_is_the_machines_lack_not_a_usage_error(
    command, capsys
):
    _no_gpu()
    assert cli.main([command, "--device", "gpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"kerastower {command}: error: `--device gpu` needs a GPU, and "
        "TensorFlow sees none on this machine (TensorFlow "
    ), err
    assert "use `--device cpu`" in err


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_flag_of_kerastower_after_the_command_says_where_it_goes(capsys):
    err = _usage_error(["launch", "--verbose", "-n", "2", "train.py"], capsys)
    assert err.startswith("usage: kerastower launch")
    assert err.endswith(
        "kerastower launch: error: unrecognized arguments: --verbose (an option "
        "of kerastower, not of launch: put it before the command, as in "
        "`kerastower --verbose launch ...`)\n"
    ), err
    err = _usage_error(["devices", "--version"], capsys)
    assert "as in `kerastower --version devices ...`)" in err
    # `demo` and `devices` take `--verbose` themselves.
    assert cli._parser().parse_args(["devices", "--verbose"]).verbose


def test_suggestions_come_from_the_parser_that_failed(capsys):
    err = _usage_error(["launch", "--bogus", "-n", "2", "train.py"], capsys)
    assert err.endswith("unrecognized arguments: --bogus\n"), err
    err = _usage_error(["launch", "--tower", "2", "-n", "2", "train.py"], capsys)
    assert "unrecognized arguments: --tower (did you mean --towers?)" in err
    err = _usage_error(["--verbse", "devices"], capsys)
    assert "kerastower devices: error: unrecognized arguments: --verbse " in err
    assert "(did you mean --verbose?)" in err
    err = _usage_error(["devices", "--toewrs", "2"], capsys)
    assert "unrecognized arguments: --toewrs 2 (did you mean --towers?)" in err


def test_an_unknown_flag_without_a_command_is_named(capsys):
    err = _usage_error(["--bogus"], capsys)
    assert err.endswith("kerastower: error: unrecognized arguments: --bogus\n"), err
    err = _usage_error(["--verison"], capsys)
    assert "unrecognized arguments: --verison (did you mean --version?)" in err
    # Abbreviations of the command's flags are its flags.
    err = _usage_error(["--verb"], capsys)
    assert "the following arguments are required: command" in err


def test_version_reads_package_metadata_without_tensorflow():
    import keras
    import tensorflow as tf

    import kerastower

    result = run(sys.executable, "-X", "importtime", "-m", "kerastower", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"kerastower {kerastower.__version__} (TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__})\n"
    )
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", result.stderr, flags=re.M)
    assert "kerastower.cli.command" in imported
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras")]


def test_every_default_of_the_demo_is_in_its_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "seed for data order and weights (default: 0)" in help_text
    parser = cli._parser().commands["demo"]
    for action in parser._actions:
        if action.default not in (None, False, argparse.SUPPRESS) and action.help:
            assert "(default:" in action.help, action.option_strings
