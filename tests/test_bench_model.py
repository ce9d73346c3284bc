"""``gguflm bench``'s model runs: depths (``-d``, filled before each timed run as llama-bench does),
the peers of ``--compare`` (llama-cpp, hf) and their ratios, on a tiny model."""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguflm.bench import model as bench
from gguflm.progress import ProgressBar

TINY = Path(__file__).resolve().parent / "data" / "arch" / "llama.gguf"


def bench_json(*args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gguflm.bench", "model", "-m", str(TINY), "-r", "2", "-t", "1",
                           "-q", "-o", "json", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_depth_fills_the_cache_untimed_before_every_run():
    calls: list[tuple] = []
    runner = bench.Runner(clear=lambda: calls.append(("clear",)),
                          prompt=lambda tokens, n_batch: calls.append(("prompt", len(tokens), tokens[0], n_batch)),
                          generate=lambda tokens: calls.append(("generate", len(tokens))),
                          close=lambda: None)
    args = argparse.Namespace(batch_size=4)
    result = bench.BenchResult("gguflm", "m", 0, 0, 1, 4, 4, "f16", "f16", n_prompt=0, n_gen=3, n_depth=10)
    assert result.test == "tg3 @ d10"
    run = bench._test_fn(runner, result, args, n_vocab=1000, bos=7, rng=random.Random(0))
    with ProgressBar("bench", enabled=False) as bar:
        bench._measure([(result, run)], 2, bar)
    # warm-up and two repetitions: an empty cache, the depth's tokens (BOS first) in n_batch
    # chunks, then the test's tokens
    assert calls == [("clear",), ("prompt", 10, 7, 4), ("generate", 3)] * 3
    assert len(result.samples_ns) == 2
    assert math.isclose(result.avg_ts, sum(1e9 * 3 / ns for ns in result.samples_ns) / 2)


def test_depths_and_prompt_sizes_run_on_gguflm():
    records = bench_json("-p", "16,40", "-n", "4", "-d", "0,24", "-b", "16", "-ub", "8")
    assert [(r["test"], r["n_depth"]) for r in records] == [
        ("pp16", 0), ("pp40", 0), ("pp16 @ d24", 24), ("pp40 @ d24", 24), ("tg4", 0), ("tg4 @ d24", 24)]
    for r in records:
        assert r["engine"] == "gguflm" and r["avg_ts"] > 0 and len(r["samples_ns"]) == 2


def test_compare_hf_needs_transformers(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["-m", str(TINY), "--compare", "hf", "-q"])
    assert args.compare == ["hf"]
    real = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    assert bench.run(args) == 2
    assert "--compare hf needs transformers" in capsys.readouterr().err


def test_compare_hf_runs_transformers_on_the_same_file():
    # the peer is optional (the bench-hf extra): CI does not install torch
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    records = bench_json("-p", "16", "-n", "4", "-d", "0,8", "--compare", "hf")
    assert {(r["engine"], r["test"]) for r in records} == {
        (e, t) for e in ("gguflm", "hf") for t in ("pp16", "tg4", "pp16 @ d8", "tg4 @ d8")}
    for r in records:
        assert r["avg_ts"] > 0
        if r["engine"] == "gguflm":
            peer = next(p for p in records if p["engine"] == "hf" and p["test"] == r["test"])
            assert math.isclose(r["ratio_vs_hf"], r["avg_ts"] / peer["avg_ts"])


def test_lora_adds_an_engine_and_its_ratio_to_the_base(tmp_path):
    from lora_files import write_lora

    adapter = write_lora(tmp_path / "a.gguf", TINY, np.random.default_rng(0), rank=8)
    records = bench_json("-p", "0", "-n", "4", "--lora", str(adapter))
    assert [(r["engine"], r["test"]) for r in records] == [("gguflm", "tg4"), ("gguflm+lora", "tg4")]
    base, lora = records
    assert lora["ratio_vs_gguflm"] == pytest.approx(lora["avg_ts"] / base["avg_ts"])
    done = subprocess.run([sys.executable, "-m", "gguflm.bench", "model", "-m", str(TINY), "-r", "1", "-t", "1",
                           "-q", "-p", "0", "-n", "2", "--lora-scaled", str(adapter), "0.5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "tg2 t=1: gguflm+lora / gguflm = " in done.stdout


def test_lora_of_another_model_is_refused(tmp_path):
    from lora_files import write_lora

    adapter = write_lora(tmp_path / "a.gguf", TINY, np.random.default_rng(0), rank=8, arch="gemma3")
    done = subprocess.run([sys.executable, "-m", "gguflm.bench", "model", "-m", str(TINY), "-q", "-n", "2",
                           "-p", "0", "--lora", str(adapter)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "gguflm bench:" in done.stderr and "Traceback" not in done.stderr
