"""Checkpoint files: their names, and writing them so a crash loses nothing.

`latest_checkpoint` and `checkpoint_epoch` find checkpoints by the
``{epoch}``/``{batch}`` fields of a `ModelCheckpoint`-style `filepath`; the
rest write files atomically (a hidden temporary file, flushed to disk, then
renamed onto the real path), as `ChiefCheckpoint` and `BackupAndRestore` do.
"""

from __future__ import annotations

import os
import re
import string
import uuid
from collections.abc import Callable

TEMP_PREFIX = ".kerastower-tmp-"
"""Names of the chief's in-progress files start with this; they never match."""

_COUNTERS = ("epoch", "batch")


def name_regex(filepath: str) -> re.Pattern:
    """A regex for the file names `filepath` formats to, with `epoch`/`batch`."""
    if "{" in os.path.dirname(filepath):
        raise ValueError(
            "Finding checkpoints needs the `{...}` fields of `filepath` in the "
            f"file name, not in the directory. Received: filepath={filepath}"
        )
    parts = []
    try:
        fields = list(string.Formatter().parse(os.path.basename(filepath)))
    except ValueError as error:
        raise ValueError(
            f"`filepath` is not a valid format string ({error}). "
            f"Received: filepath={filepath}"
        ) from None
    for literal, field, _, _ in fields:
        parts.append(re.escape(literal))
        if field is None:
            continue
        if field in _COUNTERS and f"(?P<{field}>" not in "".join(parts):
            parts.append(rf"\s*(?P<{field}>\d+)")
        elif field in _COUNTERS:
            parts.append(r"\s*\d+")
        else:
            parts.append(r".+?")
    return re.compile("^" + "".join(parts) + "$")


def static_dir(filepath: str) -> str:
    """The longest directory of `filepath` that has no `{...}` field."""
    kept = []
    for part in os.path.dirname(filepath).split(os.sep):
        if "{" in part:
            break
        kept.append(part)
    return os.sep.join(kept) or os.curdir


def latest_checkpoint(filepath: str) -> str | None:
    """Returns the latest checkpoint that a checkpoint callback wrote to `filepath`.

    Among the files whose names match `filepath` (a `ModelCheckpoint` pattern
    such as ``"ckpt/{epoch:03d}-{val_loss:.3f}.keras"``), the latest is the one
    with the largest ``{epoch}``, then ``{batch}``; files that tie on both (or
    patterns without them) are ordered by modification time, then by name.
    The chief's unfinished temporary files are never returned.

    Example:

    ```python
    import keras

    import kerastower

    filepath = "ckpt/{epoch:03d}.keras"
    path = kerastower.callbacks.latest_checkpoint(filepath)  # None if none yet
    if path is not None:
        model = keras.models.load_model(path)  # with its optimizer state
        initial_epoch = kerastower.callbacks.checkpoint_epoch(path, filepath)
        print(f"resume from {path}: fit(..., initial_epoch={initial_epoch})")
    ```

    Args:
        filepath: The callback's `filepath` pattern. Its `{...}` fields must
            all be in the file name, not in the directory.

    Returns:
        The path of the latest checkpoint, or ``None`` if there is none.

    Raises:
        ValueError: If `filepath` has fields in its directory part or is not
            a valid format string.
    """
    found = list_checkpoints(filepath)
    return found[-1] if found else None


def list_checkpoints(filepath: str) -> list[str]:
    """Returns every checkpoint written to `filepath`, the latest last.

    The order is that of `latest_checkpoint`: by ``{epoch}``, then
    ``{batch}``, then modification time and name. The chief's unfinished
    temporary files are never listed.

    Args:
        filepath: The callback's `filepath` pattern. Its `{...}` fields must
            all be in the file name, not in the directory.

    Returns:
        The paths of the checkpoints; empty if there is none.

    Raises:
        ValueError: If `filepath` has fields in its directory part or is not
            a valid format string.
    """
    filepath = os.fspath(filepath)
    regex = name_regex(filepath)
    directory = os.path.dirname(filepath) or os.curdir
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = regex.match(name)
        if name.startswith(TEMP_PREFIX) or match is None:
            continue
        path = os.path.join(directory, name)
        try:
            modified = os.path.getmtime(path)
        except OSError:  # replaced or removed since the listing
            continue
        if not os.path.isfile(path):
            continue
        counters = match.groupdict()
        key = (
            int(counters.get("epoch") or -1),
            int(counters.get("batch") or -1),
            modified,
            name,
        )
        found.append((key, path))
    return [path for _, path in sorted(found)]


def checkpoint_epoch(path: str, filepath: str) -> int | None:
    """Returns the ``{epoch}`` value in the name of checkpoint `path`.

    For a checkpoint written at the end of an epoch this is the number of
    epochs completed, which is the `initial_epoch` to pass to `fit` when
    resuming from it.

    Example:

    ```python
    import kerastower

    epoch = kerastower.callbacks.checkpoint_epoch(
        "ckpt/007-0.1234.keras", "ckpt/{epoch:03d}-{val_loss:.4f}.keras"
    )
    print(epoch)  # 7
    ```

    Args:
        path: A checkpoint file written by a callback with `filepath`.
        filepath: The callback's `filepath` pattern.

    Returns:
        The epoch number in the name, or ``None`` if the name does not match
        `filepath` or `filepath` has no ``{epoch}`` field.

    Raises:
        ValueError: If `filepath` has fields in its directory part.
    """
    match = name_regex(os.fspath(filepath)).match(os.path.basename(os.fspath(path)))
    if match is None or match.groupdict().get("epoch") is None:
        return None
    return int(match.group("epoch"))


def write_error(what: str, path: str, error: BaseException) -> OSError:
    return OSError(f"ChiefCheckpoint could not {what} {path!r}: {error}")


def fsync(path: str, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:  # Some platforms cannot open directories; best effort.
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Writes `path` whole or not at all.

    ``write(temp)`` writes a hidden temporary file (named with `TEMP_PREFIX`)
    in the directory of `path`; it is flushed to disk and renamed onto `path`.
    On any error the temporary file is removed and the error propagates, and
    whatever was at `path` before is intact.
    """
    directory = os.path.dirname(path) or os.curdir
    name = f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{os.path.basename(path)}"
    temp = os.path.join(directory, name)
    try:
        write(temp)
        fsync(temp)
        os.replace(temp, path)
    except BaseException:
        remove_quietly(temp)
        raise


def remove_leftovers(
    directory: str, prefixes: tuple[str, ...] = (TEMP_PREFIX,)
) -> None:
    """Removes the files of `directory` whose names start with `prefixes`:
    by default the temporary files of writes a killed process left."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith(prefixes):
            remove_quietly(os.path.join(directory, name))
