"""Bad backups: a damaged pointer, another model's weights, a cut arrays file.

Each is refused at the start of `fit` with a `ValueError` that names the
file and says what to do, before any step trains.
"""

import json

import numpy as np
import pytest
from keras_family import keras

import kerastower


def build(units=4):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(units)(inputs), towers=2)
    model.compile(optimizer="adam", loss="mse")
    return model


def data(units=4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 3)), rng.normal(size=(16, units))


def fit(model, backup_dir, units=4):
    x, y = data(units)
    backup = kerastower.callbacks.BackupAndRestore(
        backup_dir, save_freq=1, delete_checkpoint=False
    )
    return model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[backup])


@pytest.fixture
def backed_up(tmp_path):
    fit(build(), tmp_path / "backup")
    return tmp_path / "backup"


def test_a_backup_records_the_global_batch(backed_up):
    state = json.loads((backed_up / "latest.json").read_text())
    assert (state["epoch"], state["step"], state["global_batch"]) == (0, 2, 8)


def test_a_damaged_pointer_is_named(backed_up):
    pointer = backed_up / "latest.json"
    pointer.write_text(pointer.read_text()[:20])
    with pytest.raises(ValueError, match="latest.json is damaged: it lacks"):
        fit(build(), backed_up)


def test_another_models_backup_is_refused(backed_up):
    with pytest.raises(ValueError, match="does not load into this model"):
        fit(build(units=5), backed_up, units=5)


def test_a_cut_arrays_file_is_named(backed_up):
    state = json.loads((backed_up / "latest.json").read_text())
    arrays = backed_up / state["arrays"]
    arrays.write_bytes(arrays.read_bytes()[:30])
    with pytest.raises(ValueError, match=r"\.npz is damaged"):
        fit(build(), backed_up)
