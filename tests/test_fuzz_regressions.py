"""Every input fuzzing found a bug with (tests/fuzz/regressions/TARGET/), replayed through its
target's check: it must now hold what the target states (see tests/fuzz/)."""

from __future__ import annotations

import pytest

from tests.fuzz import REGRESSIONS_DIR, TARGETS, inputs, replay

CASES = [(target, path) for target in TARGETS for path in inputs(target, "regressions")]


def test_every_regression_folder_names_a_target():
    assert {p.name for p in REGRESSIONS_DIR.iterdir() if p.is_dir()} <= set(TARGETS)
    assert CASES


@pytest.mark.parametrize("target,path", CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_regression_input_holds(target, path):
    replay(target, path.read_bytes())
