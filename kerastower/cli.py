"""The ``kerastower`` command: ``kerastower demo`` and ``kerastower devices``.

``kerastower demo`` trains a small convnet on scikit-learn's bundled digits
over several towers (all GPUs, or logical CPUs when there is none), trains
the same model from the same initial weights on one device, and reports how
the batches were split, the accuracy, the time per epoch and the largest
weight difference between the two runs. It needs no download.

``kerastower devices`` lists the devices `TowerModel` would use.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

DEFAULT_CPU_TOWERS = 4
DEFAULT_TOLERANCE = 1e-4


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    from kerastower import __version__

    parser = argparse.ArgumentParser(
        prog="kerastower",
        description="Train one Keras model on several devices, exactly.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="train a small convnet on the digits over several towers",
        description=(
            "Train a small convnet on scikit-learn's digits over several "
            "towers, train it again on one device from the same initial "
            "weights, and report the batch split, accuracy, time per epoch "
            "and the largest weight difference between the two runs."
        ),
    )
    _add_device_arguments(demo)
    demo.add_argument(
        "--epochs", type=_positive_int, default=3, help="epochs (default: 3)"
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=30,
        help="the global batch size, all towers together (default: 30)",
    )
    demo.add_argument(
        "--seed", type=int, default=0, help="seed for data order and weights"
    )
    demo.add_argument(
        "--log-dir",
        default=None,
        help="write TensorBoard logs of TowerMonitor here (default: none)",
    )
    demo.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="largest weight difference accepted as exact (default: 1e-4)",
    )
    demo.add_argument(
        "--quiet", action="store_true", help="no progress bar, only the report"
    )

    devices = commands.add_parser(
        "devices",
        help="list the devices towers would use",
        description="List the devices TowerModel would use, one per tower.",
    )
    _add_device_arguments(devices)
    return parser


def _add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--towers",
        type=_positive_int,
        default=None,
        help=(
            "number of towers (default: every GPU; without a GPU, "
            f"{DEFAULT_CPU_TOWERS} logical CPUs for demo, 1 for devices)"
        ),
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="run the towers on GPUs or on logical CPUs (default: auto)",
    )


class _UsageError(Exception):
    """A problem with the command line, reported without a traceback."""


def _setup_towers(towers: int | None, device: str, cpu_default: int) -> list[str]:
    """Picks (and on CPUs creates) the tower devices before TensorFlow starts."""
    import tensorflow as tf

    import kerastower

    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise _UsageError("`--device gpu`: TensorFlow sees no GPU on this machine.")
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
    return kerastower.configure_logical_devices(towers or cpu_default)


def _describe(devices: Sequence[str]) -> str:
    kinds = {"GPU" if "GPU" in d.upper() else "CPU" for d in devices}
    if kinds == {"GPU"}:
        return f"{len(devices)} GPU" + ("s" if len(devices) > 1 else "")
    if len(devices) == 1:
        return "1 CPU"
    return f"{len(devices)} logical CPUs"


def _devices_command(args: argparse.Namespace) -> int:
    import keras
    import tensorflow as tf

    import kerastower
    from kerastower import cluster

    if args.towers is None and args.device == "auto":
        devices = kerastower.available_devices()
    else:
        devices = _setup_towers(args.towers, args.device, cpu_default=1)
    physical = {
        kind: len(tf.config.list_physical_devices(kind)) for kind in ("CPU", "GPU")
    }
    print(
        f"kerastower {kerastower.__version__}, TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}"
    )
    print(f"Physical devices: {physical['CPU']} CPU, {physical['GPU']} GPU")
    print(f"TowerModel(towers={len(devices)}) would use {_describe(devices)}:")
    for i, name in enumerate(devices):
        print(f"  tower {i}  {name}")
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
        one device within the tolerance; 2 for a usage error.
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "devices":
            return _devices_command(args)
        from kerastower import demo

        devices = _setup_towers(args.towers, args.device, DEFAULT_CPU_TOWERS)
        return demo.run(
            devices,
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            log_dir=args.log_dir,
            tolerance=args.tolerance,
            verbose=0 if args.quiet else 1,
        )
    except _UsageError as error:
        print(f"kerastower {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
