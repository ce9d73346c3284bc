"""The soak of `gguflm serve` (gguflm.bench.soak), bounded: 32 concurrent clients mixing streams,
tool calls, JSON schema, cancels and dropped connections against the two real models served with
`--models-max 1`. 20 s by default; GGUFLM_SOAK_SECONDS=600 for the full ten minutes
(`gguflm bench soak` runs it from the command line).

The resident-memory bound (< 5% growth after the warm-up) is asserted on runs of 120 s or more:
a 20 s run sees too few model switches for its early and late peaks to compare (on a loaded
2-core machine its figure came out at +7-8%, where 180 s runs gave +3.6%); it is printed always.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')

from gguflm.bench import soak  # noqa: E402

RSS_CHECKED_FROM = 120.0     # seconds of soak


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
    if seconds >= RSS_CHECKED_FROM:
        assert report.rss_growth < 0.05, report.describe()
