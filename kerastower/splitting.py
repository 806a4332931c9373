"""Pure batch-splitting math shared by the tower steps.

A global batch of ``B`` examples is cut into ``N`` contiguous shards, one per
tower. The first ``B mod N`` towers get ``floor(B / N) + 1`` examples, the
others ``floor(B / N)``; when ``B < N`` the last towers get none. Shard ``i``
holds examples ``[start_i, start_i + size_i)`` so concatenating the shards in
tower order restores the input order.

Each tower's loss is weighted by its share of the global batch,
``w_i = size_i / B``, so that for a loss that is a mean over examples::

    sum_i w_i * mean(loss over shard i) = mean(loss over the global batch)

which is the loss one device computes on the whole batch.
"""

from __future__ import annotations

import tensorflow as tf


def _check_counts(batch_size: int, towers: int) -> None:
    if not isinstance(towers, int) or isinstance(towers, bool) or towers < 1:
        raise ValueError(
            f"`towers` must be an integer >= 1. Received: towers={towers!r}"
        )
    if (
        not isinstance(batch_size, int)
        or isinstance(batch_size, bool)
        or batch_size < 0
    ):
        raise ValueError(
            f"`batch_size` must be an integer >= 0. Received: batch_size={batch_size!r}"
        )


def split_sizes(batch_size: int, towers: int) -> list[int]:
    """Returns how many examples of a global batch each tower gets.

    `TowerModel` cuts a **global** batch of ``B`` examples into ``N``
    contiguous shards in input order: the first ``B mod N`` towers get
    ``B // N + 1`` examples, the others ``B // N``.

    Example:

    ```python
    >>> import kerastower
    >>> kerastower.split_sizes(10, 3)
    [4, 3, 3]
    >>> kerastower.split_sizes(1, 4)
    [1, 0, 0, 0]
    ```

    Args:
        batch_size: The global batch size ``B`` (all towers together), an
            integer of at least 0.
        towers: The number of towers ``N``, an integer of at least 1.

    Returns:
        A list of ``N`` integers summing to ``B``; entry ``i`` is
        ``B // N + (1 if i < B % N else 0)``.

    Raises:
        ValueError: If ``batch_size`` is negative or ``towers`` is less than 1.
    """
    _check_counts(batch_size, towers)
    base, rest = divmod(batch_size, towers)
    return [base + (1 if i < rest else 0) for i in range(towers)]


def split_offsets(batch_size: int, towers: int) -> list[int]:
    """Returns the first index of each tower's shard in the global batch.

    Args:
        batch_size: The global batch size, an integer >= 0.
        towers: The number of towers, an integer >= 1.

    Returns:
        A list of ``N`` start offsets; shard ``i`` is
        ``[offsets[i], offsets[i] + sizes[i])``.
    """
    offsets, start = [], 0
    for size in split_sizes(batch_size, towers):
        offsets.append(start)
        start += size
    return offsets


def loss_weights(batch_size: int, towers: int) -> list[float]:
    """Returns each tower's loss weight ``size_i / B``.

    Args:
        batch_size: The global batch size ``B``, an integer >= 1.
        towers: The number of towers, an integer >= 1.

    Returns:
        A list of ``N`` floats summing to 1; a tower with no example gets 0.
    """
    if batch_size == 0:
        raise ValueError("`batch_size` must be >= 1. Received: batch_size=0")
    return [size / batch_size for size in split_sizes(batch_size, towers)]


def tensor_split_sizes(batch_size: tf.Tensor, towers: int) -> tf.Tensor:
    """Graph version of `split_sizes` for a dynamic (tensor) batch size.

    Args:
        batch_size: A scalar int32 tensor, the global batch size.
        towers: The number of towers, a Python integer >= 1.

    Returns:
        An int32 tensor of shape ``(towers,)`` equal to
        ``split_sizes(batch_size, towers)``.
    """
    batch_size = tf.cast(batch_size, tf.int32)
    base = batch_size // towers
    rest = batch_size - base * towers
    extra = tf.cast(tf.range(towers) < rest, tf.int32)
    return base + extra
