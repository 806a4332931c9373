"""Saving, loading, stock callbacks and the constructor's contract."""

import subprocess
import sys

import keras
import numpy as np
import pytest
from oracle import assert_same_history, assert_same_weights, mlp, regression_data, twin
from processes import checkout_env

import kerastower
from kerastower.model import FunctionalTowerModel


def test_keras_file_round_trip_needs_no_custom_objects(tmp_path):
    x, y = regression_data()
    model = kerastower.TowerModel.from_model(mlp(), towers=3)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, batch_size=5, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, kerastower.TowerModel)
    assert loaded.num_towers == 3
    assert_same_weights(model, loaded, rtol=0, atol=0)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6
    )
    # Training resumes with the restored optimizer state, as on one device.
    model.fit(x, y, batch_size=5, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=5, epochs=1, verbose=0, shuffle=False)
    assert_same_weights(model, loaded)


_LOAD = """
import kerastower
import keras
model = keras.models.load_model({path!r})
print(type(model).__name__, model.num_towers)
"""


def test_import_kerastower_alone_lets_a_fresh_process_load_the_file(tmp_path):
    # The guides' promise: `import kerastower` registers the classes, so a
    # program that never names `TowerModel` loads a `.keras` file as one.
    # (Importing the public names only on first use broke it.)
    model = kerastower.TowerModel.from_model(mlp(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "model.keras"
    model.save(path)
    env = checkout_env(TF_CPP_MIN_LOG_LEVEL="3", KERASTOWER_LOGICAL_DEVICES="2")
    result = subprocess.run(
        [sys.executable, "-c", _LOAD.format(path=str(path))],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["FunctionalTowerModel", "2"]


def test_get_config_round_trip_keeps_towers_and_batch_norm_option():
    model = kerastower.TowerModel.from_model(mlp(), towers=2, sync_batch_norm=False)
    config = model.get_config()
    assert config["towers"] == 2 and config["sync_batch_norm"] is False
    clone = FunctionalTowerModel.from_config(config)
    assert clone.num_towers == 2 and clone.sync_batch_norm is False

    listed = kerastower.TowerModel.from_model(mlp(), towers=["/device:CPU:1", "CPU:3"])
    assert listed.tower_devices == ["/device:CPU:1", "/device:CPU:3"]
    full = kerastower.TowerModel.from_model(
        mlp(), towers=["/job:localhost/replica:0/task:0/device:CPU:2"]
    )
    assert full.tower_devices == ["/device:CPU:2"]
    clone = FunctionalTowerModel.from_config(listed.get_config())
    assert clone.tower_devices == listed.tower_devices


def test_loading_on_a_machine_with_fewer_devices_uses_what_is_there():
    config = kerastower.TowerModel.from_model(mlp(), towers=4).get_config()
    config["towers"] = 16
    with pytest.warns(UserWarning, match="towers=16"):
        clone = FunctionalTowerModel.from_config(config)
    assert clone.num_towers == 4


def test_weights_files_are_interchangeable_with_a_plain_model(tmp_path):
    plain, towered = twin(mlp, 2)
    towered.compile(optimizer="sgd", loss="mse")
    towered.fit(*regression_data(), batch_size=4, epochs=1, verbose=0)
    towered.save_weights(tmp_path / "t.weights.h5")
    plain.load_weights(tmp_path / "t.weights.h5")
    assert_same_weights(plain, towered, rtol=0, atol=0)
    fresh = mlp(seed=9)
    fresh.save_weights(tmp_path / "p.weights.h5")
    towered.load_weights(tmp_path / "p.weights.h5")
    assert_same_weights(fresh, towered, rtol=0, atol=0)


def test_stock_callbacks_work_and_match_one_device(tmp_path):
    x, y = regression_data(n=30)

    def callbacks(tag):
        return [
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=1),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5),
            keras.callbacks.ModelCheckpoint(tmp_path / f"{tag}.keras"),
            keras.callbacks.BackupAndRestore(tmp_path / f"backup_{tag}"),
            keras.callbacks.TensorBoard(tmp_path / f"tb_{tag}"),
            keras.callbacks.CSVLogger(tmp_path / f"{tag}.csv"),
            keras.callbacks.TerminateOnNaN(),
        ]

    plain, towered = twin(mlp, 3)
    histories = []
    for tag, model in (("plain", plain), ("tower", towered)):
        model.compile(optimizer=keras.optimizers.SGD(0.3), loss="mse")
        history = model.fit(
            x,
            y,
            batch_size=7,
            epochs=6,
            verbose=0,
            shuffle=False,
            validation_split=0.2,
            callbacks=callbacks(tag),
        )
        histories.append(history.history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
    assert (tmp_path / "tower.keras").exists()
    assert (tmp_path / "tower.csv").read_text().count("\n") == len(
        histories[1]["loss"]
    ) + 1
    assert any((tmp_path / "tb_tower").rglob("*tfevents*"))


def test_terminate_on_nan_stops_training():
    x, y = regression_data()
    y[3] = np.nan
    model = kerastower.TowerModel.from_model(mlp(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(
        x,
        y,
        batch_size=4,
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[keras.callbacks.TerminateOnNaN()],
    )
    assert len(history.history["loss"]) == 1
    assert np.isnan(history.history["loss"][0])


@pytest.mark.parametrize("towers", [0, -1, 2.5, "two", True])
def test_bad_towers_get_a_keras_style_error(towers):
    with pytest.raises(ValueError, match=r"`towers` must be .*Received: towers="):
        kerastower.TowerModel.from_model(mlp(), towers=towers)


def test_too_many_towers_lists_the_available_devices():
    with pytest.raises(ValueError, match=r"at most .*4: .*CPU:0.*Received: towers=5"):
        kerastower.TowerModel.from_model(mlp(), towers=5)
    with pytest.raises(ValueError, match=r"does not exist: 'GPU:0'"):
        kerastower.TowerModel.from_model(mlp(), towers=["GPU:0"])
    with pytest.raises(ValueError, match="twice"):
        kerastower.TowerModel.from_model(mlp(), towers=["CPU:0", "/device:CPU:0"])


def test_mismatched_x_and_y_keep_keras_own_error():
    x, y = regression_data()
    model = kerastower.TowerModel.from_model(mlp(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="same number of samples|sizes"):
        model.fit(x, y[:-3], verbose=0)


def test_overriding_train_step_warns():
    with pytest.warns(UserWarning, match="not split across towers"):

        class Custom(kerastower.TowerModel):
            def train_step(self, data):
                return super().train_step(data)

        Custom(towers=2)


def test_from_model_rejects_subclassed_models():
    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="functional or Sequential"):
        kerastower.TowerModel.from_model(Sub())


def test_sequential_and_default_towers():
    seq = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    model = kerastower.TowerModel.from_model(seq)
    assert model.num_towers == 4  # every logical CPU of the test session
    assert model.layers[-1] is seq.layers[-1]  # layers are shared, not rebuilt
