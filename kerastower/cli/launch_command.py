"""``kerastower launch``'s command line: its options and what they run.

The launcher itself is `kerastower.launch.launch`; this module parses
``launch``'s arguments (the script's go to the workers untouched) and prints
a `TF_CONFIG` for ``--hosts``. Plain Python, no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Sequence

from kerastower.launch import DEFAULT_GRACE_PERIOD, launch
from kerastower.worker_configs import check_count, tf_config_for

USAGE = (
    "%(prog)s [-h] -n N [--towers K[,K...]] [--grace-period S] [-m] "
    "script [args ...]\n       %(prog)s --hosts HOST:PORT[,...] --index I [--export]"
)
# The options of `add_arguments` that take a value.
_VALUE_OPTIONS = frozenset(
    "-n --num-workers --towers --grace-period --hosts --index".split()
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the launcher's options to `parser`; `split_argv` holds the script."""
    parser.add_argument(
        "-n", "--num-workers", type=int, metavar="N", help="workers to start"
    )
    parser.add_argument(
        "--towers",
        metavar="K[,K...]",
        help="towers per worker: one number for all, or one per worker",
    )
    parser.add_argument(
        "-m", "--module", action="store_true", help="run a module, as python -m"
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD,
        metavar="S",
        help="seconds from SIGTERM to SIGKILL when workers are stopped "
        f"(default: {DEFAULT_GRACE_PERIOD:g})",
    )
    parser.add_argument(
        "--hosts",
        metavar="HOST:PORT[,...]",
        help="start nothing; print the TF_CONFIG of worker --index of these",
    )
    parser.add_argument(
        "--index", type=int, metavar="I", help="the worker's index in --hosts"
    )
    parser.add_argument(
        "--export", action="store_true", help="print it as a shell export line"
    )


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits ``launch``'s arguments into the launcher's and the script's.

    The script is the first argument that is not an option of the launcher,
    or the one after ``--``. It and the arguments after it go to the workers
    untouched (``--`` and ``-h`` included), as argparse would not leave them.
    """
    argv = list(argv)
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return argv[:i], argv[i + 1 :]
        if not argv[i].startswith("-") or argv[i] == "-":
            return argv[:i], argv[i:]
        i += 2 if argv[i] in _VALUE_OPTIONS else 1
    return argv, []


def run(args: argparse.Namespace, script_argv: Sequence[str]) -> int:
    """Runs ``kerastower launch``: prints a `TF_CONFIG` or starts workers.

    Args:
        args: The launcher's options, as `kerastower.cli` parses them.
        script_argv: The script (or module) and its arguments.

    Returns:
        The exit status: that of `launch`, or 0 after printing a `TF_CONFIG`.

    Raises:
        ValueError: For a usage error, with the message to show.
    """
    if args.hosts is not None:
        if script_argv or args.num_workers or args.towers or args.module:
            raise ValueError(
                "`--hosts` prints a TF_CONFIG and starts nothing: leave out the "
                "script, -n, --towers and -m."
            )
        if args.index is None:
            raise ValueError("`--index` is required with `--hosts`.")
        config = json.dumps(tf_config_for(args.hosts, args.index))
        print(f"export TF_CONFIG={shlex.quote(config)}" if args.export else config)
        return 0
    if args.index is not None or args.export:
        raise ValueError("`--index` and `--export` go with `--hosts`.")
    if not script_argv or args.num_workers is None:
        raise ValueError(
            "`-n` and a script are required to start workers (or `--hosts` and "
            "`--index` to print the TF_CONFIG of a worker of a real cluster)."
        )
    if not args.grace_period >= 0:
        raise ValueError(
            "`--grace-period` must be a number of seconds >= 0. Received: "
            f"--grace-period={args.grace_period:g}"
        )
    if not args.module and not os.path.exists(script_argv[0]):
        raise ValueError(
            f"`script` must be an existing file. Received: script={script_argv[0]!r}"
        )
    return launch(
        script_argv,
        check_count("-n", args.num_workers),
        args.towers,
        module=args.module,
        grace_period=args.grace_period,
    )
