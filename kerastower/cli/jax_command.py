"""``kerastower demo`` and ``kerastower devices`` on Keras's JAX backend.

JAX reads its devices' settings when it starts, so they are set here first:
``--towers N`` CPU devices of its own (``XLA_FLAGS``; on a machine with GPUs
the towers are its GPUs), ``--device cpu`` the CPU platform alone.
"""

from __future__ import annotations

import argparse
import os
import sys

from kerastower.cli import versions


def _error(args: argparse.Namespace, message: str, status: int) -> int:
    print(f"kerastower {args.command}: error: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace, default_cpu_towers: int) -> int:
    """Runs the ``demo`` or ``devices`` command of `args` on JAX.

    Returns:
        The exit status: as the TensorFlow commands' (0, 1 for a demo whose
        towers differ from one device or a machine without what was asked
        for, 2 for a usage error).
    """
    if getattr(args, "log_dir", None):
        return _error(
            args,
            "`--log-dir` writes TowerMonitor's logs, which runs on TensorFlow; "
            "not on JAX. Received: --log-dir=" + args.log_dir,
            2,
        )
    cpus = args.towers or (default_cpu_towers if args.command == "demo" else 1)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={cpus}"
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if args.device == "gpu" and jax.default_backend() != "gpu":
        return _error(
            args,
            f"`--device gpu` needs a GPU, and JAX {jax.__version__} sees none on "
            "this machine (install `jax[cuda12]` or `jax[cuda13]`): leave out "
            "`--device` or use `--device cpu`.",
            1,
        )
    if args.command == "devices":
        devices = jax.devices()[: args.towers] if args.towers else jax.devices()
        print(versions.jax_version_line())
        print(f"TowerModel(towers={len(devices)}) would use:")
        for i, device in enumerate(devices):
            kind = getattr(device, "device_kind", "")
            print(f"  tower {i}  {device.platform}:{device.id}  {kind}")
        return 0
    from kerastower.cli import demo_jax

    try:
        return demo_jax.run(
            args.towers,
            epochs=args.epochs,
            batch_size=args.batch_size or 32,
            seed=args.seed,
            tolerance=args.tolerance,
            verbose=0 if args.quiet else 1,
        )
    except ValueError as error:  # `--towers` more than the devices
        return _error(args, str(error), 2)
