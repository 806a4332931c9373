"""``kerastower launch``'s command line: its options and what they run.

The launcher itself is `kerastower.launch.launch` (and
`kerastower.launch.launch_slurm_task` for ``--slurm``); this module parses
``launch``'s arguments (the script's go to the workers untouched) and prints
a `TF_CONFIG` for ``--hosts``. Plain Python, no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Sequence

from kerastower.workers.configs import check_count, tf_config_for
from kerastower.workers.launch import (
    DEFAULT_GRACE_PERIOD,
    NETWORKS,
    launch,
    launch_slurm_task,
)
from kerastower.workers.slurm import DEFAULT_PORT_BASE

USAGE = (
    "%(prog)s [-h] -n N [--towers K[,K...]] [--grace-period S] "
    "[--max-restarts K [--restart-preempted]] [--evaluator] "
    "[--network {private,host}] [-m] "
    "script [args ...]"
    "\n       %(prog)s --hosts HOST:PORT[,...] --index I [--export]"
    "\n       %(prog)s --slurm [--port-base P] [--gpus-per-task G] "
    "[--towers K[,K...]] [--grace-period S] [-m] script [args ...]"
)
# The options of `add_arguments` that take a value.
_VALUE_OPTIONS = frozenset(
    "-n --num-workers --towers --grace-period --max-restarts --hosts --index "
    "--port-base --gpus-per-task --network".split()
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
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="after a worker fails, stop the others and start every worker "
        "again, up to K times (default: 0)",
    )
    parser.add_argument(
        "--restart-preempted",
        action="store_true",
        help="with --max-restarts: restart also after a worker exits with 143 "
        "(preempted, after its backup)",
    )
    parser.add_argument(
        "--evaluator",
        action="store_true",
        help="start one more process, the cluster's evaluator task, that runs "
        "the same script (see kerastower.evaluator.SidecarEvaluator)",
    )
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        help="private: the workers run in a network of their own, loopback "
        "only, that nothing outside reaches (Linux); host: this machine's "
        "network (default: private where the system allows it, else host)",
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
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="run this Slurm task's worker, its TF_CONFIG read from Slurm's "
        "environment (one launcher per task: srun kerastower launch --slurm ...)",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        metavar="P",
        help="with --slurm: the port of the first task on each node "
        f"(default: {DEFAULT_PORT_BASE}; the next tasks take the next ports)",
    )
    parser.add_argument(
        "--gpus-per-task",
        type=int,
        metavar="G",
        help="with --slurm: set CUDA_VISIBLE_DEVICES to the task's G GPUs "
        "(default: SLURM_GPUS_PER_TASK; without it, leave it as it is)",
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
        The exit status: that of `launch` or `launch_slurm_task`, or 0 after
        printing a `TF_CONFIG`.

    Raises:
        ValueError: For a usage error, with the message to show.
    """
    if args.slurm and (args.num_workers is not None or args.hosts is not None):
        raise ValueError(
            "`--slurm` takes the workers from Slurm's environment: leave out "
            "`-n` and `--hosts`."
        )
    if not args.slurm and (
        args.port_base is not None or args.gpus_per_task is not None
    ):
        raise ValueError("`--port-base` and `--gpus-per-task` go with `--slurm`.")
    if args.network is not None and (args.slurm or args.hosts is not None):
        raise ValueError(
            "`--network` goes with `-n` (local workers): with `--hosts` or "
            "`--slurm` the workers are on several machines and need their "
            "network; see the Security page of the docs."
        )
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
    if args.slurm and (args.max_restarts or args.restart_preempted):
        raise ValueError(
            "`--max-restarts` and `--restart-preempted` restart local workers; "
            "under Slurm, requeue the job (`sbatch --requeue`) instead."
        )
    if args.slurm and args.evaluator:
        raise ValueError(
            "`--evaluator` starts a local evaluator process; under Slurm, run "
            'the evaluator as a step of its own, its TF_CONFIG task "evaluator".'
        )
    if args.restart_preempted and not args.max_restarts:
        raise ValueError("`--restart-preempted` goes with `--max-restarts`.")
    if args.slurm and not script_argv:
        raise ValueError("`--slurm` needs a script to run.")
    if not script_argv or (args.num_workers is None and not args.slurm):
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
    if args.slurm:
        return launch_slurm_task(
            script_argv,
            port_base=DEFAULT_PORT_BASE if args.port_base is None else args.port_base,
            gpus_per_task=args.gpus_per_task,
            towers=args.towers,
            module=args.module,
            grace_period=args.grace_period,
        )
    return launch(
        script_argv,
        check_count("-n", args.num_workers),
        args.towers,
        module=args.module,
        grace_period=args.grace_period,
        max_restarts=args.max_restarts,
        restart_preempted=args.restart_preempted,
        evaluator=args.evaluator,
        network=args.network,
    )
