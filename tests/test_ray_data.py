"""gguflm.ray.data on a local Ray (2 CPUs, loopback): embeddings with all-MiniLM, completions with
SmolLM2 and rerank scores, over 2 actors, equal row for row to the single-process API; a row that
fails is recorded in the error column and the job goes on; model files by path or URI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason='the ray extra: pip install "gguflm[ray]"')

from gguflm import LLM  # noqa: E402
from gguflm.errors import ModelSourceError  # noqa: E402
from gguflm.ray.data import ERROR_COLUMN, Embed, Generate, Rerank  # noqa: E402
from gguflm.ray.files import local_model  # noqa: E402

MINILM = Path(__file__).resolve().parent / "data" / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
WORDS = "river stone cloud lamp orchard violin harbor pepper meadow engine lantern quartz".split()


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config={"metrics_report_interval_ms": 60_000})
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def texts(n: int) -> list[str]:
    rng = np.random.default_rng(5)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


def test_embeddings_over_two_actors_equal_the_api():
    items = texts(200)
    ds = ray.data.from_items([{"text": t} for t in items]).map_batches(
        Embed, fn_constructor_kwargs={"model": str(MINILM), "normalize": True},
        concurrency=2, num_cpus=1, batch_size=25)
    rows = ds.take_all()
    got = {r["text"]: np.asarray(r["embedding"]) for r in rows}
    assert len(rows) == len(items) and all(r[ERROR_COLUMN] is None for r in rows)
    llm = LLM(MINILM, embedding=True, n_threads=1, progress=False)
    for text in items:
        np.testing.assert_array_equal(got[text], np.asarray(llm.embed(text, normalize=True), np.float32))


def test_packed_embeddings_and_a_failing_row():
    # packed, a batch's vectors are the API's for that list; a row too long for the batch (no
    # truncation) fails alone
    items = texts(8)
    items[5] = "word " * 600
    rows = ray.data.from_items([{"text": t} for t in items]).map_batches(
        Embed, fn_constructor_kwargs={"model": str(MINILM), "pack": True, "truncate": False},
        concurrency=1, num_cpus=1, batch_size=8).take_all()
    llm = LLM(MINILM, embedding=True, n_threads=1, progress=False)
    assert "exceed" in rows[5][ERROR_COLUMN] and np.isnan(rows[5]["embedding"]).all()
    assert [r[ERROR_COLUMN] is None for r in rows] == [i != 5 for i in range(8)]
    for row in rows[:5] + rows[6:]:
        np.testing.assert_array_equal(row["embedding"], np.asarray(llm.embed(row["text"]), np.float32))


def test_completions_over_two_actors_equal_the_api(smollm_path):
    prompts = [f"The {w} is" for w in WORDS[:10]]
    sampling = {"max_tokens": 12, "temperature": 0.0}
    # row 3 asks for a grammar of its own; row 7's grammar is malformed: its error is recorded
    own = [None] * len(prompts)
    own[3] = json.dumps({"grammar": 'root ::= "yes" | "no"', "max_tokens": 4})
    own[7] = json.dumps({"grammar": "root ::= ("})
    ds = ray.data.from_items([{"prompt": p, "sampling": s} for p, s in zip(prompts, own)]).map_batches(
        Generate, fn_constructor_kwargs={"model": str(smollm_path), "chat": False, "sampling": sampling},
        concurrency=2, num_cpus=1, batch_size=3)
    got = {r["prompt"]: r for r in ds.take_all()}
    llm = LLM(smollm_path, n_ctx=2048, n_threads=1, progress=False)
    for prompt, row_sampling in zip(prompts, own):
        row = got[prompt]
        arguments = {**sampling, **json.loads(row_sampling or "{}")}
        if prompt == prompts[7]:
            with pytest.raises(Exception) as failed:
                llm.create_completion(prompt, **arguments)
            assert row["generated_text"] is None
            assert row[ERROR_COLUMN] == f"{type(failed.value).__name__}: {failed.value}"
            continue
        want = llm.create_completion(prompt, **arguments)
        assert row[ERROR_COLUMN] is None
        assert row["generated_text"] == want["choices"][0]["text"]
        assert row["finish_reason"] == want["choices"][0]["finish_reason"]
    assert got[prompts[3]]["generated_text"] in ("yes", "no")


def test_chat_with_a_json_schema_per_job(smollm_path):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
              "required": ["name"]}
    sampling = {"max_tokens": 24, "temperature": 0.0,
                "response_format": {"type": "json_object", "schema": schema}}
    conversations = [[{"role": "user", "content": f"Name a {w}."}] for w in WORDS[:2]]
    # one column of message lists (Ray Data hands them as arrays of dicts)
    ds = ray.data.from_items([{"messages": m} for m in conversations]).map_batches(
        Generate, fn_constructor_kwargs={"model": str(smollm_path), "sampling": sampling},
        concurrency=1, num_cpus=1, batch_size=2)
    rows = ds.take_all()
    llm = LLM(smollm_path, n_ctx=2048, n_threads=1, progress=False)
    for row in rows:
        want = llm.create_chat_completion([dict(m) for m in row["messages"]], **sampling)
        assert row[ERROR_COLUMN] is None
        assert row["generated_text"] == want["choices"][0]["message"]["content"]


def test_rerank_rows_equal_the_api(tmp_path):
    from tiny_models import TinyModel, write_tiny_model

    path = tmp_path / "reranker.gguf"
    write_tiny_model(TinyModel("bert", pooling_type=4, classifier=True), path, np.random.default_rng(3))
    pairs = [{"query": q, "document": d} for q, d in zip(texts(6), texts(12)[6:])]
    rows = ray.data.from_items(pairs).map_batches(
        Rerank, fn_constructor_kwargs={"model": str(path)}, concurrency=1, num_cpus=1, batch_size=3).take_all()
    llm = LLM(path, embedding=True, pooling_type="rank", n_threads=1, progress=False)
    got = {(r["query"], r["document"]): r["score"] for r in rows}
    for p in pairs:
        assert got[p["query"], p["document"]] == llm.rerank(p["query"], [p["document"]])[0]


def test_model_sources(tmp_path):
    import functools
    import http.server
    import threading

    assert local_model(str(MINILM)) == MINILM
    assert local_model(MINILM.as_uri(), cache_dir=tmp_path) == MINILM      # file:// is a path
    with pytest.raises(ModelSourceError, match="no readable file .* on node"):
        local_model(tmp_path / "missing.gguf")
    # a URI is fetched into the node's cache once; later calls find it there
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(MINILM.parent))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}/{MINILM.name}"
    try:
        fetched = local_model(uri, cache_dir=tmp_path / "cache")
    finally:
        server.shutdown()
        server.server_close()
    assert fetched.read_bytes() == MINILM.read_bytes() and fetched.parent.parent == tmp_path / "cache"
    assert local_model(uri, cache_dir=tmp_path / "cache") == fetched       # the server is gone
    with pytest.raises(ModelSourceError, match="could not fetch .* on node"):
        local_model(uri.replace(MINILM.name, "other.gguf"), cache_dir=tmp_path / "cache")
