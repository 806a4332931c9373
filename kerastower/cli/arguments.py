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
    closest flag of the parser that read it, and says where a flag of the
    ``kerastower`` command given after a subcommand goes."""

    def __init__(self, *args, **kwargs):
        self.flags: list[str] = []
        self.commands: dict[str, Parser] = {}
        self.active: str | None = None
        self.argv: list[str] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.flags += [flag for flag in action.option_strings if flag.startswith("--")]
        return action

    def parse_known_args(self, args=None, namespace=None):
        if args is not None and not self.argv:
            self.argv = list(args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        command = self.commands.get(self.active or "")
        if command is None and message.startswith("the following arguments"):
            # argparse checks for the command before it reports what it did
            # not recognise: `kerastower --bogus` would only miss a command.
            unknown = [a for a in self.argv if a[:1] == "-" and not self._known(a)]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        if message.startswith("unrecognized arguments:"):
            message += self._hints(message.split()[2:], command)
        # The subcommand's usage, with the message as it stands.
        argparse.ArgumentParser.error(command or self, message)

    def _known(self, arg: str) -> bool:
        """Whether `arg` is a flag of this parser, or an abbreviation of one."""
        flag = arg.split("=")[0]
        return flag in ("-h", "--help") or any(f.startswith(flag) for f in self.flags)

    def _hints(self, unknown: list[str], command: Parser | None) -> str:
        """What to say of each unknown flag: the closest flag of the parser
        that read it (this one before the subcommand, the subcommand's after
        it), or where a flag of this parser given after the subcommand goes."""
        after = (
            self.argv[self.argv.index(self.active) + 1 :]
            if command is not None and self.active in self.argv
            else []
        )
        hints = []
        for arg in unknown:
            flag = arg.split("=")[0]
            if flag[:2] != "--":
                continue
            if arg in after and flag in self.flags:
                hints.append(
                    f"an option of {self.prog}, not of {self.active}: put it "
                    f"before the command, as in `{self.prog} {flag} "
                    f"{self.active} ...`"
                )
                continue
            known = {f[2:]: f for f in (command.flags if arg in after else self.flags)}
            # Compared without the "--" that every flag shares.
            match = difflib.get_close_matches(flag[2:], known, n=1, cutoff=0.6)
            if match:
                hints.append(f"did you mean {known[match[0]]}?")
        return f" ({'; '.join(hints)})" if hints else ""


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
