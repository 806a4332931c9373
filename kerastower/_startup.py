"""What importing kerastower does to the process, before TensorFlow starts.

TensorFlow fixes its devices and its cluster when its runtime starts (the
first op, variable or model), so `import kerastower` settles both first
(`prepare_process`), once it has refused a ``$KERAS_BACKEND`` other than
TensorFlow:

- the logical CPUs that ``kerastower launch --towers`` asks for through
  ``$KERASTOWER_LOGICAL_DEVICES`` (`kerastower.devices.configure_from_environment`);
- this process as a worker of the cluster that `TF_CONFIG` names
  (`kerastower.multi_worker.prepare_workers`).

The ``kerastower`` command line (`started_as_command`) gets neither: it sets up
its devices from its own flags, never joins a cluster, and loads TensorFlow
only for the subcommands that need it, so that ``kerastower launch`` and
``--help`` start at once.
"""

from __future__ import annotations

import sys

COMMAND_MODULES = ("kerastower", "kerastower.cli")


def started_as_command() -> bool:
    """Whether this process is the ``kerastower`` command line.

    That is the ``kerastower`` console script, whose module
    (``kerastower_command``, outside the package) notes it before it imports
    kerastower, or an interpreter started as ``python -m kerastower`` (or
    ``-m kerastower.cli``), read from the interpreter's own command line
    (``sys.orig_argv``). ``sys.argv``, which a program may set as it likes,
    is not read: a program that imports kerastower gets the whole package.

    Returns:
        ``True`` in the command line's process, ``False`` elsewhere.
    """
    script = sys.modules.get("kerastower_command")
    if getattr(script, "STARTED", False):
        return True
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] in COMMAND_MODULES
    return False


def on_jax() -> bool:
    """Whether kerastower runs on Keras 3's JAX backend (``KERAS_BACKEND=jax``)."""
    from kerastower import _installed_keras

    return _installed_keras.backend() == _installed_keras.JAX_BACKEND


def prepare_process() -> None:
    """Configures devices and the cluster worker from the environment.

    `kerastower/__init__.py` calls it first, once; it does nothing in the
    command line.

    Raises:
        ImportError: If ``$KERAS_BACKEND`` sets Keras 3 to a backend other
            than TensorFlow.
        ValueError: If ``$KERASTOWER_LOGICAL_DEVICES`` is not an integer >= 1.
    """
    if started_as_command():
        return
    from kerastower import _installed_keras

    # Before TensorFlow, whose import imports Keras on that backend.
    _installed_keras.check_backend_variable()
    if on_jax():
        return  # JAX's devices are its own (`kerastower.on_jax`)
    from kerastower import devices
    from kerastower.workers import multi_worker

    devices.configure_from_environment()
    multi_worker.prepare_workers()
