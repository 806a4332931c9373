"""The ``kerastower`` command line: ``demo``, ``devices`` and ``launch``.

A leaf: nothing in the library imports it. `kerastower.cli.command` parses
the arguments and runs the subcommands; `kerastower.cli.demo` is the demo's
training run; `kerastower.cli.launch_command` is ``launch``'s options;
`kerastower.cli.quiet_tensorflow` imports TensorFlow without its start-up log.
"""

from kerastower.cli.command import main

__all__ = ["main"]
