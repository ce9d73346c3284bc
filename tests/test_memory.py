"""estimate_memory against the resident memory a fresh process gains from loading a model,
creating a context and running pp512 + tg128; fit_context against estimate_memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import gguflm
from gguflm.gguf import GGUFReader
from gguflm.models import get_architecture

# One measurement per process. The baseline is taken once numpy and every gguflm module the run
# will use are imported, so the growth is the model's and the context's. glibc's mmap threshold
# is pinned: by default it rises after the first large free and later allocations of the
# kernels' threads fragment the heap (RSS creeping during generation, reported separately), which
# no estimate of what is held can predict.
_MEASURE = r"""
import json, sys
import numpy as np
import gguflm
from gguflm import Batch, Context, Model
import gguflm.context, gguflm.model, gguflm.vocab, gguflm.sampling

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

path, n_ctx, cache_type = sys.argv[1], int(sys.argv[2]), sys.argv[3]
before = rss()
model = Model.load(path)
ctx = Context(model, n_ctx=n_ctx, type_k=cache_type, type_v=cache_type, n_threads=1)
ids = np.random.default_rng(0).integers(100, model.vocab.n_tokens - 100, 512).tolist()
assert ctx.decode(Batch.get_one(ids)) == 0
for _ in range(128):
    assert ctx.decode(Batch.get_one([int(np.argmax(ctx.get_logits_ith(-1)))])) == 0
print(json.dumps({"growth": rss() - before}))
"""


def _measured_growth(path, n_ctx: int, cache_type: str) -> int:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(n_ctx), cache_type],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["growth"]


@pytest.mark.parametrize("n_ctx", [1024, 8192])
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_estimate_within_5_percent_of_measured_rss(real_model_path, n_ctx, cache_type):
    estimate = gguflm.estimate_memory(real_model_path, n_ctx=n_ctx, type_k=cache_type, type_v=cache_type)
    measured = _measured_growth(real_model_path, n_ctx, cache_type)
    error = (estimate.total - measured) / measured
    assert abs(error) <= 0.05, (f"estimate {estimate.total / 2**20:.1f} MiB, measured "
                                f"{measured / 2**20:.1f} MiB ({error:+.1%})\n{estimate.describe()}")


def test_parts_follow_the_file(gemma_path):
    # figures that come from the file, read here with the gguf package's type codes (tests/_metadata.py)
    from _metadata import read_metadata

    meta = read_metadata(gemma_path)
    arch = meta["general.architecture"]
    field = lambda key: meta[f"{arch}.{key}"]
    n_layer, n_head_kv = int(field("block_count")), int(field("attention.head_count_kv"))
    head_k, head_v = int(field("attention.key_length")), int(field("attention.value_length"))
    window = int(field("attention.sliding_window"))
    est = gguflm.estimate_memory(gemma_path, n_ctx=8192, type_k="f16", type_v="f16")
    assert est.weights == gemma_path.stat().st_size
    # gemma 3: every sixth layer is global, the others slide over a window-sized cache
    n_global = n_layer // 6
    swa_cells = -(-(window + 512) // 256) * 256
    assert est.kv_cells == (8192, swa_cells)
    row = n_head_kv * (head_k + head_v) * 2
    assert est.kv_cache == (n_global * 8192 + (n_layer - n_global) * swa_cells) * row + 16 * (8192 + swa_cells)
    # q8_0 rows: 34 bytes per 32 values
    q8 = gguflm.estimate_memory(gemma_path, n_ctx=8192, type_k="q8_0", type_v="q8_0")
    assert q8.kv_cache == (n_global * 8192 + (n_layer - n_global) * swa_cells) * row * 34 // 64 + 16 * (8192 + swa_cells)
    assert q8.compute == est.compute and q8.vocab == est.vocab
    assert est.total == est.weights + est.kv_cache + est.compute + est.vocab + est.runtime


def test_compute_buffers_are_the_planners(smollm_path):
    # the single-token and full-ubatch plans a real context records hold exactly these arenas
    model = gguflm.Model.load(smollm_path)
    with model, gguflm.Context(model, n_ctx=1024, n_ubatch=256) as ctx:
        sizes = [ctx.compute_buffer_size(1), ctx.compute_buffer_size(256)]
    est = gguflm.estimate_memory(smollm_path, n_ctx=1024, n_ubatch=256)
    n_vocab = model.hparams.n_vocab
    assert est.compute == sum(sizes) + 2 * 4 * n_vocab
    assert sizes[0] < sizes[1]


def test_fit_context(smollm_path):
    budget = gguflm.estimate_memory(smollm_path, n_ctx=4096).total
    assert gguflm.fit_context(smollm_path, budget) == 4096
    assert gguflm.fit_context(smollm_path, budget - 1) == 3840
    assert gguflm.fit_context(smollm_path, 10**12) == 8192  # the training context
    assert gguflm.fit_context(smollm_path, 1) == 0


def test_bad_input(tmp_path, smollm_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(gguflm.ModelLoadError):
        gguflm.estimate_memory(bad)
    with pytest.raises(gguflm.ModelLoadError):
        gguflm.estimate_memory(tmp_path / "missing.gguf")
    with pytest.raises(ValueError):
        gguflm.estimate_memory(smollm_path, type_k="q4_0")


def test_a_cache_per_sequence_is_estimated_as_the_context_lays_it_out(smollm_path):
    # kv_unified=False rounds each sequence's region up to 256 cells: 3 sequences in 1000 cells
    # take 3 × 512, not the unified cache's 1024
    unified = gguflm.estimate_memory(smollm_path, n_ctx=1000, n_seq_max=3)
    split = gguflm.estimate_memory(smollm_path, n_ctx=1000, n_seq_max=3, kv_unified=False)
    model = gguflm.Model.load(smollm_path)
    with model, gguflm.Context(model, n_ctx=1000, n_seq_max=3, kv_unified=False) as ctx:
        cells = tuple(c.size for c in ctx._caches)
    assert unified.kv_cells == (1024,)
    assert split.kv_cells == cells == (1536,)
    assert split.kv_cache * 1024 == unified.kv_cache * 1536
    # a budget for 1024 unified cells holds 3 regions of 256 (768), not 3 of 512
    budget = gguflm.estimate_memory(smollm_path, n_ctx=1024, n_seq_max=3).total
    assert gguflm.fit_context(smollm_path, budget, n_seq_max=3) == 1024
    assert gguflm.fit_context(smollm_path, budget, n_seq_max=3, kv_unified=False) == 768
