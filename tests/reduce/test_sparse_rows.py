"""Which sparse gradients the towers merge by index, and which they concatenate.

One device gathers a table once per batch (position embeddings gathered with
``range(length)``): the towers' rows of it are merged by index. A gather of
the examples' ids is concatenated, whether the batch size is known or not
(a batch that splits evenly over the towers gives shards of a static size).
"""

import numpy as np
import pytest
import tensorflow as tf

from kerastower.reduce.gradients import has_static_rows

TABLE = tf.Variable(np.arange(20.0).reshape(10, 2), dtype=tf.float32)
POSITIONS = tf.constant([0, 1, 2])  # made eagerly: captured by a trace
CHOSEN = tf.Variable([4, 5, 6])


def rows_rule(indices_of, batch):
    """`has_static_rows` of the table's gradient for ids of `batch` rows."""
    found = []

    @tf.function(input_signature=[tf.TensorSpec([batch, 3], tf.int32)])
    def traced(ids):
        with tf.GradientTape() as tape:
            gathered = tf.gather(TABLE, indices_of(ids))
            loss = tf.reduce_sum(gathered * gathered)
        gradient = tape.gradient(loss, TABLE)
        assert isinstance(gradient, tf.IndexedSlices)
        found.append(has_static_rows([gradient]))
        return loss

    traced.get_concrete_function()
    return found[0]


@pytest.mark.parametrize("batch", [None, 4], ids=["unknown", "static"])
def test_the_examples_ids_are_concatenated(batch):
    assert not rows_rule(lambda ids: ids, batch)
    assert not rows_rule(lambda ids: tf.reshape(ids[:, :2] + 1, [-1]), batch)


@pytest.mark.parametrize("batch", [None, 4], ids=["unknown", "static"])
@pytest.mark.parametrize(
    "indices_of",
    [
        lambda ids: tf.range(3),
        lambda ids: tf.range(tf.shape(ids)[1]),  # the positions' idiom
        lambda ids: POSITIONS,
        lambda ids: CHOSEN.read_value(),
    ],
    ids=["range", "range of the length", "captured constant", "variable"],
)
def test_a_table_gathered_once_per_batch_is_merged(indices_of, batch):
    assert rows_rule(indices_of, batch)


def test_positions_of_an_unknown_length_are_concatenated():
    # ``range(length)`` of a length read off the batch: rows unknown.
    assert not rows_rule(lambda ids: tf.range(tf.shape(ids)[0]), None)
