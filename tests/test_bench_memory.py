"""The load-time and memory benchmark runs each engine in a fresh process and reports sane figures."""

from __future__ import annotations

import pytest

from _llama import require_peer
from gguflm.bench import memory
from gguflm.bench.__main__ import main as bench_main


def test_gguflm_figures_from_a_fresh_process(smollm_path):
    row = memory.summarize([memory.measure("gguflm", str(smollm_path), 256, 64, 4, 1)])
    size_mb = smollm_path.stat().st_size / 2**20
    assert row["engine"] == "gguflm" and row["load_ctx_ms"] > 0 and row["runs"] == 1
    # a memory-mapped load touches no weights; running the model does
    assert row["rss_loaded_mb"] - row["rss_start_mb"] < 0.5 * size_mb
    assert row["rss_run_mb"] - row["rss_start_mb"] > 0.5 * size_mb
    assert row["rss_peak_mb"] >= row["rss_run_mb"] - 1


def test_table_beside_llama_cpp(smollm_path, capsys):
    require_peer()
    assert bench_main(["memory", "-m", str(smollm_path), "-c", "256", "-p", "32", "-n", "4", "-r", "1",
                       "-t", "1", "--compare", "llama-cpp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {cells[0]: [float(c) for c in cells[1:]]
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[3:])}
    assert set(rows) == {"gguflm", "llama.cpp"}
    assert all(len(v) == 5 and min(v) > 0 for v in rows.values())


def test_bad_arguments_are_refused(smollm_path):
    with pytest.raises(SystemExit):
        bench_main(["memory", "-m", str(smollm_path), "-c", "16", "-p", "32"])
