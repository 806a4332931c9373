"""The ``kerastower`` command's argument parsing: flags, values, errors.

Plain Python, no TensorFlow: `--help` and a usage error answer at once.
"""

from __future__ import annotations

import argparse
import difflib
import re

# The launcher's Python arguments, as `kerastower launch` names them.
FLAG_NAMES = {
    "num_workers": "-n",
    "towers": "--towers",
    "grace_period": "--grace-period",
    "index": "--index",
    "port_base": "--port-base",
    "gpus_per_task": "--gpus-per-task",
    "max_restarts": "--max-restarts",
}


def as_flags(error: Exception) -> str:
    """`error`'s message with the launcher's argument names as flags."""
    message = str(error)
    for name, flag in FLAG_NAMES.items():
        message = re.sub(rf"`{name}`", f"`{flag}`", message)
        message = re.sub(rf"\b(?<!-){name}=", f"{flag}=", message)
    return message


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose error for an unknown flag suggests the
    closest one of the command given."""

    def __init__(self, *args, **kwargs):
        self.flags: list[str] = []
        self.commands: dict[str, Parser] = {}
        self.active: str | None = None
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.flags += [flag for flag in action.option_strings if flag.startswith("--")]
        return action

    def error(self, message: str):
        command = self.commands.get(self.active or "")
        if message.startswith("unrecognized arguments:") and "(did you" not in message:
            known = self.flags + (command.flags if command else [])
            unknown = [a.split("=")[0] for a in message.split()[2:] if a[:2] == "--"]
            hints = [
                match
                for flag in unknown
                for match in difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            ]
            if hints:
                message += f" (did you mean {', '.join(hints)}?)"
        if command is not None:
            command.error(message)
        super().error(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value
