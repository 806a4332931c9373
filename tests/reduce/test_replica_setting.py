"""``replicate_variables="auto"``: replicas where the towers are GPUs."""

import pytest
from oracle import assert_same_history, assert_same_weights, mlp, regression_data, twin

import kerastower
from kerastower.reduce.replica_setting import FORCE_VARIABLE, replicates

CPUS = ["/job:localhost/replica:0/task:0/device:CPU:0", "/device:CPU:1"]
GPUS = ["/job:localhost/replica:0/task:0/device:GPU:0", "/device:GPU:1"]


def test_auto_replicates_on_gpus_on_one_worker_only():
    empty = {}
    assert replicates("auto", GPUS, environ=empty) is True
    assert replicates("auto", CPUS, environ=empty) is False
    assert replicates("auto", GPUS[:1], environ=empty) is False
    assert replicates("auto", GPUS, num_workers=2, environ=empty) is False
    assert replicates("auto", [GPUS[0], CPUS[1]], environ=empty) is False
    # An explicit setting is kept, whatever the devices or the variable say.
    assert replicates(True, CPUS, environ={FORCE_VARIABLE: "0"}) is True
    assert replicates(False, GPUS, environ={FORCE_VARIABLE: "1"}) is False
    assert replicates(True, CPUS[:1], environ=empty) is False  # one tower
    # The variable decides "auto" on any device, on one worker.
    assert replicates("auto", CPUS, environ={FORCE_VARIABLE: "1"}) is True
    assert replicates("auto", GPUS, environ={FORCE_VARIABLE: "0"}) is False
    # On several workers every worker decides alike, even with one tower.
    assert replicates("auto", CPUS, 2, environ={FORCE_VARIABLE: "1"}) is True
    assert replicates(True, CPUS[:1], 2, environ=empty) is True
    assert replicates("auto", GPUS, environ={FORCE_VARIABLE: " "}) is True


def test_auto_replicates_a_train_step_of_ones_own_on_five_gpus_or_more():
    empty: dict[str, str] = {}
    eight = [f"/GPU:{i}" for i in range(8)]
    assert replicates("auto", eight[:4], environ=empty, own_step=True) is False
    assert replicates("auto", eight[:5], environ=empty, own_step=True) is True
    assert replicates("auto", eight, environ=empty, own_step=True) is True
    assert replicates(True, eight[:2], environ=empty, own_step=True) is True
    assert replicates("auto", CPUS, environ={FORCE_VARIABLE: "1"}, own_step=True)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="must be True, False or 'auto'.*=1"):
        replicates(1, CPUS)
    with pytest.raises(ValueError, match="must be True, False or 'auto'.*='on'"):
        kerastower.TowerModel.from_model(mlp(), towers=2, replicate_variables="on")
    with pytest.raises(ValueError, match=f"must be 0 or 1.*{FORCE_VARIABLE}='yes'"):
        replicates("auto", CPUS, environ={FORCE_VARIABLE: "yes"})


@pytest.mark.parametrize("force", [None, "0", "1"])
def test_the_default_on_logical_cpus_follows_the_variable(force, monkeypatch):
    if force is None:
        monkeypatch.delenv(FORCE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(FORCE_VARIABLE, force)
    towered = kerastower.TowerModel.from_model(mlp(), towers=2)
    assert towered.replicate_variables == "auto"
    assert towered.get_config()["replicate_variables"] == "auto"
    assert (towered._tower_step.replicas is not None) is (force == "1")


def test_auto_keeps_replicas_under_xla_and_stays_exact(monkeypatch):
    monkeypatch.setenv(FORCE_VARIABLE, "1")
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, 3)
    for model in (plain, towered):
        model.compile(optimizer="adam", loss="mse", jit_compile=True)
    histories = [
        m.fit(x, y, batch_size=5, epochs=2, verbose=0, shuffle=False).history
        for m in (plain, towered)
    ]
    assert towered._tower_step.replicas.built
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
