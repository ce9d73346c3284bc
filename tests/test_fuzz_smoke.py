"""The fuzz targets' smoke run: every target's committed seeds and regression inputs replayed in
process (no atheris needed), then a short coverage-guided atheris run over all targets at once
(``python -m tests.fuzz all``), a few thousand inputs in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import TARGETS, inputs, replay

ROOT = Path(__file__).resolve().parents[1]
SMOKE_RUNS = 3000


@pytest.mark.parametrize("target", TARGETS)
def test_seed_corpus_holds(target):
    seeds = inputs(target)
    assert seeds, f"no seeds for {target}"
    for path in seeds + inputs(target, "regressions"):
        replay(target, path.read_bytes())


def test_atheris_smoke_run(tmp_path):
    try:
        import atheris  # noqa: F401
    except ImportError:
        if os.environ.get("GGUFLM_REQUIRE_PEER"):
            raise
        pytest.skip("atheris is not installed (pip install '.[fuzz]')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "tests.fuzz", "all", "--runs", str(SMOKE_RUNS),
                          "--work", str(tmp_path / "corpus"), "--artifacts", str(tmp_path / "findings"),
                          "--", "-seed=1", "-max_total_time=25"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done " in run.stderr and not list((tmp_path / "findings").iterdir())
