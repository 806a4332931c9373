"""Sparse inputs are cut by rows across the towers, exactly.

`keras.Input(sparse=True)` takes a `tf.SparseTensor` or a SciPy sparse
matrix (Keras turns the latter into the former); towers cut it into row
blocks, as they cut dense inputs. `tf.split` cannot cut a `tf.SparseTensor`:
this raised a `TypeError` once.
"""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf
from keras_family import keras
from oracle import KERAS_MINOR, fit_and_compare


def sparse_model():
    keras.utils.set_random_seed(0)
    x = keras.Input((6,), sparse=True)
    h = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(x, keras.layers.Dense(2)(h))


def sparse_rows(n=23):
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(n, 6)).astype("float32")
    dense *= rng.uniform(size=(n, 6)) < 0.3
    dense[4] = 0.0  # a row without an entry
    # An entry in the last row: Keras 3.14 counts a sparse array's rows up to
    # its last entry, and its own `fit` fails without one (one device too).
    dense[-1, 0] = 1.0
    y = rng.normal(size=(n, 2)).astype("float32")
    return dense, y


# Keras 3.10 to 3.13's own `fit` fails on a sparse array whose last batch is
# shorter ("indices[2] = 22 is not in [0, 22)" in its data adapter), one
# device too.
KERAS_SLICES_SPARSE_ARRAYS = KERAS_MINOR >= (3, 14)


def compile_kwargs():
    return dict(optimizer=keras.optimizers.Adam(0.02), loss="mse", metrics=["mae"])


@pytest.mark.skipif(
    not KERAS_SLICES_SPARSE_ARRAYS, reason="Keras < 3.14 cannot fit sparse arrays"
)
@pytest.mark.parametrize("replicate", [False, True], ids=["shared", "replicas"])
@pytest.mark.parametrize("kind", ["tf", "scipy"])
def test_sparse_inputs_train_as_one_device(kind, replicate):
    dense, y = sparse_rows()
    x = tf.sparse.from_dense(dense) if kind == "tf" else scipy.sparse.csr_matrix(dense)
    # Batches of 5 over 3 towers: shards of 2, 2 and 1 rows, and a last
    # batch of 3 rows.
    fit_and_compare(
        sparse_model,
        x,
        y,
        compile_kwargs,
        towers=3,
        batch_size=5,
        epochs=2,
        tower_kwargs=dict(replicate_variables=replicate),
    )


def test_a_sparse_dataset_trains_as_one_device():
    dense, y = sparse_rows()
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.sparse.from_dense(dense), y)
    ).batch(7)
    fit_and_compare(sparse_model, dataset, None, compile_kwargs, towers=4, epochs=2)
