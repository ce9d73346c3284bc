"""The soak of `gguflm serve` (gguflm.bench.soak), bounded: 32 concurrent clients mixing streams,
tool calls, JSON schema, cancels and dropped connections against the two real models served with
`--models-max 1`. 20 s by default; GGUFLM_SOAK_SECONDS=600 for the full ten minutes
(`gguflm bench soak` runs it from the command line)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')

from gguflm.bench import soak  # noqa: E402


@pytest.mark.slow
def test_soak_two_models_32_clients(smollm_path, gemma_path):
    seconds = float(os.environ.get("GGUFLM_SOAK_SECONDS", "20"))
    report = soak.run([smollm_path, gemma_path], seconds, clients=32, threads=2, parallel=4)
    print(report.describe())
    assert not report.wrong, [(o.kind, o.model, o.problem) for o in report.wrong[:10]]
    kinds = {o.kind for o in report.outcomes}
    assert kinds == set(soak.KINDS) and {o.model for o in report.outcomes} == {
        smollm_path.name[:-5], gemma_path.name[:-5]}
    assert report.health_failures == 0
    assert report.rss_growth < 0.05, report.describe()
