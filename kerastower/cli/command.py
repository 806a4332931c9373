"""The ``kerastower`` command: ``demo``, ``devices`` and ``launch``.

``kerastower demo`` trains a small convnet on scikit-learn's bundled digits
over several towers (all GPUs, or logical CPUs when there is none), trains
the same model from the same initial weights on one device, and reports how
the batches were split, the accuracy, the time per epoch and the largest
weight difference between the two runs. It needs no download.

``kerastower devices`` lists the devices `TowerModel` would use, with each
GPU's name and memory.

``kerastower launch`` starts local worker processes of one cluster, or prints
the `TF_CONFIG` of a worker of a real one; see `kerastower.launch`. It never
imports TensorFlow.

The command starts quietly: TensorFlow's start-up log (oneDNN, CPU features,
absl) is left out unless ``--verbose`` is given, so the first line printed is
kerastower's own (`kerastower.cli.quiet_tensorflow`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence

from kerastower import _installed_keras as installed_keras
from kerastower.cli import arguments, launch_command, quiet_tensorflow, versions
from kerastower.cli.versions import VERBOSE_FLAG

DEFAULT_CPU_TOWERS = 4
DEFAULT_BATCH_SIZE = 30
DEFAULT_TOLERANCE = 1e-10


def _parser() -> arguments.Parser:
    parser = arguments.Parser(
        prog="kerastower",
        description="Train one Keras model on several devices, exactly.",
        epilog=(
            "Exit status: 0 on success, 1 when the machine lacks what was asked "
            "for (--device gpu without a GPU), 2 for a usage error; `demo` "
            "exits 1 also when the towers differ from one device, `launch` "
            "with the first failed worker's status."
        ),
    )
    parser.add_argument("--version", action=versions.VersionAction)
    _add_verbose_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="train a small convnet on the digits over several towers",
        description=(
            "Train a small convnet on scikit-learn's digits over several "
            "towers, train it again on one device from the same initial "
            "weights, and report the batch split, accuracy, time per epoch "
            "and how far apart the two runs ended; the verdict comes from the "
            "same runs in float64, where rounding cannot hide a difference."
        ),
        epilog=(
            "Exit status: 0 when the towers match one device in float64 "
            "within --tolerance, 1 when they do not (or the machine lacks what "
            "was asked for: --device gpu without a GPU), 2 for a usage error."
        ),
    )
    _add_device_arguments(demo, f"{DEFAULT_CPU_TOWERS} logical CPUs")
    demo.add_argument(
        "--epochs", type=arguments.positive_int, default=3, help="epochs (default: 3)"
    )
    demo.add_argument(
        "--batch-size",
        type=arguments.positive_int,
        default=None,
        help=(
            "the global batch size, all towers together (default: 30; 32 on "
            "JAX, which shards a batch that divides by the towers)"
        ),
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for data order and weights (default: 0)",
    )
    demo.add_argument(
        "--log-dir",
        default=None,
        help="write TensorBoard logs of TowerMonitor here (default: none)",
    )
    demo.add_argument(
        "--tolerance",
        type=arguments.positive_float,
        default=DEFAULT_TOLERANCE,
        help=(
            "largest relative difference of the float64 run accepted as exact "
            "(default: 1e-10)"
        ),
    )
    demo.add_argument(
        "--quiet", action="store_true", help="no progress bar, only the report"
    )

    devices = commands.add_parser(
        "devices",
        help="list the devices towers would use",
        description="List the devices TowerModel would use, one per tower.",
    )
    _add_device_arguments(devices, "the one CPU")

    launcher = commands.add_parser(
        "launch",
        help="start local workers of one cluster, or print a TF_CONFIG",
        description=(
            "Start N local worker processes of one cluster, each running "
            "`python script args...` with its own TF_CONFIG (the arguments "
            "after the script go to it unchanged); or, with --hosts, print the "
            "TF_CONFIG of one worker of a real cluster; or, with --slurm under "
            "srun, run this Slurm task's worker with the TF_CONFIG that Slurm's "
            "environment gives."
        ),
        usage=launch_command.USAGE,
        allow_abbrev=False,
    )
    launch_command.add_arguments(launcher)
    parser.commands.update(demo=demo, devices=devices, launch=launcher)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand: the first argument that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _add_verbose_argument(parser: argparse.ArgumentParser, **kwargs) -> None:
    parser.add_argument(
        VERBOSE_FLAG,
        action="store_true",
        help="show TensorFlow's start-up log (hidden by default)",
        **kwargs,
    )


def _add_device_arguments(parser: argparse.ArgumentParser, on_cpu: str) -> None:
    _add_verbose_argument(parser, default=argparse.SUPPRESS)
    parser.add_argument(
        "--towers",
        type=arguments.positive_int,
        default=None,
        help=f"number of towers (default: every GPU; without a GPU, {on_cpu})",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="run the towers on GPUs or on logical CPUs (default: auto)",
    )


class _UsageError(Exception):
    """A problem with the command line, reported without a traceback: exit 2."""


class _MachineError(Exception):
    """The machine lacks what the command line asks for: exit 1, no traceback."""


def _check_log_dir(log_dir: str | None) -> None:
    """Fails before training when `log_dir` cannot be created or written."""
    if log_dir is None:
        return
    try:
        os.makedirs(log_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=log_dir):
            pass
    except OSError as error:
        raise _UsageError(
            f"`--log-dir` must be a directory that can be written. Received: "
            f"--log-dir={log_dir!r} ({error.strerror or error})"
        ) from None


def _setup_towers(towers: int | None, device: str, cpu_default: int) -> list[str]:
    """Picks (and on CPUs creates) the tower devices before TensorFlow starts."""
    import tensorflow as tf

    from kerastower.devices import configure_logical_devices

    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        build = "with" if tf.test.is_built_with_cuda() else "without"
        raise _MachineError(
            "`--device gpu` needs a GPU, and TensorFlow sees none on this "
            f"machine (TensorFlow {tf.__version__}, built {build} CUDA): leave "
            "out `--device` or use `--device cpu` to run the towers on "
            "logical CPUs."
        )
    if device == "cpu" and gpus:
        tf.config.set_visible_devices([], "GPU")
        gpus = []
    if gpus:
        count = towers or len(gpus)
        if count > len(gpus):
            raise _UsageError(
                f"`--towers` must be at most the number of GPUs ({len(gpus)}). "
                f"Received: --towers={count}. Use `--device cpu` to try more "
                "towers on logical CPUs."
            )
        names = [d.name for d in tf.config.list_logical_devices("GPU")]
        return names[:count]
    return configure_logical_devices(towers or cpu_default)


def _describe(devices: Sequence[str]) -> str:
    kinds = {"GPU" if "GPU" in d.upper() else "CPU" for d in devices}
    if kinds == {"GPU"}:
        return f"{len(devices)} GPU" + ("s" if len(devices) > 1 else "")
    if len(devices) == 1:
        return "1 CPU"
    return f"{len(devices)} logical CPUs"


def _gpu_details(tf, name: str) -> str:
    """Describes the GPU behind a logical device name, as far as TensorFlow says.

    The name and compute capability come from
    `tf.config.experimental.get_device_details`, the memory TensorFlow holds
    on the device now and at its peak from
    `tf.config.experimental.get_memory_info`; what a build of TensorFlow does
    not report is left out.
    """
    parts = []
    index = tf.DeviceSpec.from_string(name).device_index or 0
    physical = tf.config.list_physical_devices("GPU")
    if index < len(physical):
        try:
            details = tf.config.experimental.get_device_details(physical[index])
        except (ValueError, RuntimeError):
            details = {}
        if details.get("device_name"):
            parts.append(details["device_name"])
        if details.get("compute_capability"):
            major, minor = details["compute_capability"]
            parts.append(f"compute capability {major}.{minor}")
    try:
        memory = tf.config.experimental.get_memory_info(name)
    except (ValueError, RuntimeError):
        memory = None
    if memory:
        parts.append(
            f"memory in use {memory['current'] / 2**20:.0f} MiB "
            f"(peak {memory['peak'] / 2**20:.0f} MiB)"
        )
    return ", ".join(parts)


def _devices_command(args: argparse.Namespace) -> int:
    import tensorflow as tf

    from kerastower.devices import available_devices
    from kerastower.workers import cluster

    if args.towers is None and args.device == "auto":
        devices = available_devices()
    else:
        devices = _setup_towers(args.towers, args.device, cpu_default=1)
    physical = {
        kind: len(tf.config.list_physical_devices(kind)) for kind in ("CPU", "GPU")
    }
    print(versions.version_line())
    print(f"Physical devices: {physical['CPU']} CPU, {physical['GPU']} GPU")
    print(f"TowerModel(towers={len(devices)}) would use {_describe(devices)}:")
    for i, name in enumerate(devices):
        details = _gpu_details(tf, name) if "GPU" in name.upper() else ""
        print(f"  tower {i}  {name}" + (f"  {details}" if details else ""))
    if not physical["GPU"] and len(devices) == 1:
        print(
            "No GPU: split the CPU into logical devices to try several towers, "
            "e.g. `kerastower devices --towers 4` or `kerastower demo --towers 4`."
        )
    if cluster.is_multi_worker():
        role = "chief" if cluster.is_chief() else "not the chief"
        print(
            f"TF_CONFIG: worker {cluster.worker_index()} of "
            f"{cluster.num_workers()} ({role})"
        )
    else:
        print("TF_CONFIG: not set, one worker")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``kerastower`` command line.

    Args:
        argv: The arguments after the program name; ``None`` for
            ``sys.argv[1:]``. Defaults to ``None``.

    Returns:
        The exit status: 0 on success; 1 when the demo's towers did not match
        one device within the tolerance, or when the machine lacks what was
        asked for (``--device gpu`` without a GPU); 2 for a usage error; for
        ``launch``,
        the first failed worker's status or ``128 + signal``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    script_argv: list[str] = []
    if _command(argv) == "launch":
        at = argv.index("launch") + 1
        launcher_argv, script_argv = launch_command.split_argv(argv[at:])
        argv = argv[:at] + launcher_argv
    parser = _parser()
    parser.active = _command(argv)
    args = parser.parse_args(argv)
    if args.command == "launch":
        try:
            return launch_command.run(args, script_argv)
        except ValueError as error:
            print(
                f"kerastower launch: error: {arguments.as_flags(error)}",
                file=sys.stderr,
            )
            return 2
        except OSError as error:  # the machine refuses what was asked
            print(f"kerastower launch: error: {error}", file=sys.stderr)
            return 1
    try:
        installed_keras.check_backend_variable()
    except ImportError as error:
        print(f"kerastower {args.command}: error: {error}", file=sys.stderr)
        return 1
    if installed_keras.backend() == installed_keras.JAX_BACKEND:
        from kerastower.cli import jax_command

        return jax_command.run(args, DEFAULT_CPU_TOWERS)
    quiet_tensorflow.import_tensorflow(getattr(args, "verbose", False))
    from kerastower.devices import configure_from_environment

    configure_from_environment()
    try:
        if args.command == "devices":
            return _devices_command(args)
        from kerastower.cli import demo

        _check_log_dir(args.log_dir)
        devices = _setup_towers(args.towers, args.device, DEFAULT_CPU_TOWERS)
        return demo.run(
            devices,
            epochs=args.epochs,
            batch_size=args.batch_size or DEFAULT_BATCH_SIZE,
            seed=args.seed,
            log_dir=args.log_dir,
            tolerance=args.tolerance,
            verbose=0 if args.quiet else 1,
        )
    except _UsageError as error:
        print(f"kerastower {args.command}: error: {error}", file=sys.stderr)
        return 2
    except _MachineError as error:
        print(f"kerastower {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
