"""The ``kerastower`` console script: the command line, as itself.

It lives outside the `kerastower` package so that it runs before the
package's ``__init__``: it notes that this process is the command line
(`STARTED`), and `import kerastower` then leaves TensorFlow, the devices and
the cluster to the subcommands (`kerastower._startup.started_as_command`).
Any other program that imports kerastower gets the whole package, whatever
its ``sys.argv`` says.
"""

# Set by `main` before it imports kerastower: this process is the command line.
STARTED = False


def main() -> int:
    """Runs the ``kerastower`` command line (`kerastower.cli.main`)."""
    global STARTED
    STARTED = True
    from kerastower.cli import main as command

    return command()
