"""The pure accumulation schedule: micro-batches per update, epoch by epoch."""

from kerastower.reduce.accumulation import steps_for_epoch, validate_steps


def test_pure_schedule_helpers():
    assert validate_steps(4) == {0: 4}
    assert validate_steps({2: 4}) == {0: 1, 2: 4}
    schedule = validate_steps({0: 2, 3: 8})
    assert [steps_for_epoch(schedule, e) for e in range(5)] == [2, 2, 2, 8, 8]
