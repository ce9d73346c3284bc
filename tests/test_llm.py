"""The high-level LLM API: generation, streaming, stop strings, prompt caching, cancellation,
threads, lifetime, llama-cpp-python compatibility.

Mechanics run on the tiny fixture models in tests/data/arch (a millisecond per token); what needs a
real model uses SmolLM2 (fast) and Gemma where the default model matters. Every LLM here uses one
thread: the suite runs beside other jobs on small machines, where two-thread OpenMP teams stall.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguflm
from gguflm.chat import ChatTemplateError
from gguflm.errors import Error, LoadCancelled
from gguflm.llm import LLM
from _llama import require_peer

ARCH = Path(__file__).resolve().parent / "data" / "arch"
REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
TINY = ARCH / "llama.gguf"
HYPO = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def make(path, **kwargs) -> LLM:
    kwargs.setdefault("n_ctx", 512)
    return LLM(path, n_threads=1, progress=False, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    with make(TINY, chat_template="chatml") as llm:
        yield llm


@pytest.fixture(scope="module")
def smol(smollm_path):
    with make(smollm_path, n_ctx=2048) as llm:
        yield llm


def joined(chunks) -> tuple[str, list[int], object]:
    chunks = list(chunks)
    assert all(c.finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason is not None and last.completion is not None
    ids = [t for c in chunks for t in c.token_ids]
    return "".join(c.text for c in chunks), ids, last.completion


def cache_consistent(llm: LLM) -> bool:
    return len(llm._session.tokens) == llm.context.memory.seq_pos_max(0) + 1


# -- generation and streaming

@HYPO
@given(seed=st.integers(0, 2**31), temperature=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
       max_tokens=st.integers(1, 40), prompt=st.text("abcdefgh xyz.", min_size=1, max_size=12))
def test_streamed_chunks_concatenate_to_the_non_streamed_result(tiny, seed, temperature, max_tokens,
                                                                prompt):
    tiny.reset()
    whole = tiny.complete(prompt, seed=seed, temperature=temperature, max_tokens=max_tokens)
    tiny.reset()
    text, ids, completion = joined(tiny.complete(prompt, seed=seed, temperature=temperature,
                                                 max_tokens=max_tokens, stream=True))
    assert text == whole.text == completion.text
    assert ids == whole.token_ids == completion.token_ids
    assert whole.finish_reason in ("stop", "length")
    assert len(whole.token_ids) <= max_tokens
    assert (whole.finish_reason == "length") == (len(whole.token_ids) == max_tokens)
    assert cache_consistent(tiny)


@HYPO
@given(seed=st.integers(0, 2**31), data=st.data())
def test_stop_strings_cut_the_text_and_never_leak(tiny, seed, data):
    tiny.reset()
    free = tiny.complete("ab", seed=seed, temperature=1.0, max_tokens=30)
    if len(free.text) < 2:
        return
    start = data.draw(st.integers(0, len(free.text) - 1))
    stop = free.text[start:start + data.draw(st.integers(1, 4))]
    tiny.reset()
    cut = tiny.complete("ab", seed=seed, temperature=1.0, max_tokens=30, stop=[stop])
    assert cut.text == free.text[:free.text.index(stop)]
    assert cut.finish_reason == "stop"
    tiny.reset()
    text, _, completion = joined(tiny.complete("ab", seed=seed, temperature=1.0, max_tokens=30,
                                               stop=stop, stream=True))
    assert text == cut.text == completion.text
    assert completion.finish_reason == "stop"


def test_temperature_zero_is_greedy(tiny):
    tiny.reset()
    result = tiny.complete("hello", temperature=0, max_tokens=20, logprobs=3, seed=5)
    for item in result.logprobs:
        best = max(item.top, key=lambda t: t[2])
        assert best[0] == item.token and np.isclose(best[2], item.logprob)
    tiny.reset()
    again = tiny.complete("hello", temperature=0, max_tokens=20, seed=99)
    assert again.token_ids == result.token_ids


def test_logprobs_are_log_softmax_of_the_logits(tiny):
    result = tiny.complete("xyz", temperature=1.0, seed=3, max_tokens=5, logprobs=4)
    assert len(result.logprobs) == len(result.token_ids)
    for item in result.logprobs:
        assert item.logprob <= 0 and len(item.top) == 4
        values = [lp for _, _, lp in item.top]
        assert values == sorted(values, reverse=True)
        assert np.exp(values).sum() <= 1 + 1e-6


def test_greedy_matches_llama_cpp_reference(smol, smollm_path):
    """First greedy token after each reference prompt against llama.cpp's logits there."""
    cases = json.loads((REFERENCE / (smollm_path.stem + ".json")).read_text())["cases"]
    exact = 0
    for case in cases:
        tokens = case["tokens"] if isinstance(case["tokens"], list) else json.loads(case["tokens"])
        greedy = case["greedy_tokens"]
        greedy = greedy if isinstance(greedy, list) else json.loads(greedy)
        assert smol.tokenize(case["prompt"], special=True) == tokens
        first = smol.complete(case["prompt"], temperature=0, max_tokens=1).token_ids[0]
        ref_ids, ref_logits = case["top20_ids"][-1], case["top20_logits"][-1]
        assert first in ref_ids, case["prompt"]
        assert ref_logits[ref_ids.index(first)] >= max(ref_logits) - 0.5, case["prompt"]
        exact += first == greedy[0]
    assert exact >= len(cases) - 2


def test_streamed_emoji_and_cjk_arrive_whole(smol):
    """Force a reply spelled by tokens that split characters; every chunk must hold whole ones."""
    target_text = " 😀 中文 🎉 Ωμέγα 👍🏽"
    target = smol.tokenize(target_text, add_bos=False)
    vocab = smol.model.vocab
    assert any(_broken(vocab.token_to_piece(t)) for t in target), "the test needs split characters"
    chunks = list(smol.create_completion("Say:", max_tokens=len(target), stream=True, seed=1,
                                         logits_processor=[_forcing(target)]))
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == target_text
    assert all("\ufffd" not in t for t in texts)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_straddling_tokens_is_honoured_in_stream(smol):
    target_text = " Hello world, and then some more words"
    target = smol.tokenize(target_text, add_bos=False)
    stop = "d, and th"
    pieces = [smol.detokenize([t]).decode() for t in target]
    assert not any(stop in p for p in pieces), "the stop string must span several tokens"
    chunks = list(smol.create_completion("Say:", max_tokens=len(target), stream=True, stop=[stop],
                                         logits_processor=[_forcing(target)]))
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == " Hello worl"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def _broken(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def _forcing(target: list[int]):
    """A logits processor that makes ``target`` the only choice, token after token."""
    state = {"i": 0}

    def processor(input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[target[min(state["i"], len(target) - 1)]] = 0.0
        state["i"] += 1
        return out
    return processor


# -- prompt caching

def test_shared_prefix_is_reused_and_gives_the_same_logits(smol):
    smol.reset()
    base = "The quick brown fox jumps over the lazy dog. " * 3
    first = smol.complete(base + "It", temperature=0, max_tokens=1, logprobs=5)
    assert first.timings.prompt_cached == 0
    second = smol.complete(base + "Then", temperature=0, max_tokens=1, logprobs=5)
    shared = len(smol.tokenize(base))
    assert second.timings.prompt_cached >= shared - 1
    assert second.timings.prompt_n == len(second.prompt_tokens) - second.timings.prompt_cached
    with make(smol.model_path, n_ctx=2048) as fresh:
        alone = fresh.complete(base + "Then", temperature=0, max_tokens=1, logprobs=5)
    assert alone.timings.prompt_cached == 0
    assert [t for t, _, _ in second.logprobs[0].top] == [t for t, _, _ in alone.logprobs[0].top]
    np.testing.assert_allclose([lp for *_, lp in second.logprobs[0].top],
                               [lp for *_, lp in alone.logprobs[0].top], atol=2e-2)


def test_same_prompt_again_redecodes_only_the_last_token(tiny):
    tiny.complete("abc abc abc", max_tokens=3, seed=1)
    again = tiny.complete("abc abc abc", max_tokens=3, seed=1)
    assert again.timings.prompt_n == 1
    assert again.timings.prompt_cached == len(again.prompt_tokens) - 1


def test_prefix_reuse_respects_the_sliding_window():
    """Gemma 3's window layers keep only the last positions: a prefix whose window was evicted is
    decoded again; one whose window is still cached is reused. Both give a fresh decode's logits."""
    def llm() -> LLM:
        return make(ARCH / "gemma3.gguf", n_ubatch=64)      # window 16, window cache 256 cells

    long_prompt = [10 + i % 300 for i in range(300)]
    with llm() as warm, llm() as fresh:
        for n_shared, expect_cached in ((40, 0), (150, 150)):
            prompt = long_prompt[:n_shared] + [5] * 10
            warm.complete(long_prompt, max_tokens=1, temperature=0)
            reused = warm.complete(prompt, max_tokens=1, temperature=0, logprobs=5)
            fresh.reset()
            alone = fresh.complete(prompt, max_tokens=1, temperature=0, logprobs=5)
            assert reused.timings.prompt_cached == expect_cached
            assert [t for t, *_ in reused.logprobs[0].top] == [t for t, *_ in alone.logprobs[0].top]
            # this tiny model's logits are ~100: batch-shape rounding moves them by ~1e-3
            # relative, a missing window by ~1e-2
            np.testing.assert_allclose([lp for *_, lp in reused.logprobs[0].top],
                                       [lp for *_, lp in alone.logprobs[0].top], rtol=3e-3)


@HYPO
@given(requests=st.lists(st.tuples(st.text("ab c", min_size=1, max_size=8), st.integers(1, 12),
                                   st.booleans()), min_size=1, max_size=6))
def test_cached_tokens_always_describe_the_cache(tiny, requests):
    for prompt, n, stream in requests:
        out = tiny.complete(prompt, max_tokens=n, seed=n, stream=stream)
        if stream:
            for i, _ in enumerate(out):
                if i == 1:
                    out.close()         # abandon the stream midway
                    break
        assert cache_consistent(tiny)


# -- cancellation and threads

def test_cancel_during_a_long_prompt_returns_promptly(smollm_path):
    """A 2,000-token prompt, cancelled from another thread, returns in under half a second.

    The abort is checked between layers, so the latency is at most one layer of one micro-batch;
    a 128-token micro-batch keeps that well inside the limit at today's kernel speed.
    """
    with make(smollm_path, n_ctx=4096, n_ubatch=128) as llm:
        prompt = llm.tokenize(" ".join(f"word{i}" for i in range(1000)))[:2000]
        assert len(prompt) == 2000
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(c=llm.complete(prompt, max_tokens=8)))
        worker.start()
        time.sleep(1.0)
        assert worker.is_alive(), "the prompt finished before it could be cancelled"
        start = time.perf_counter()
        llm.cancel()
        worker.join(5)
        latency = time.perf_counter() - start
        assert not worker.is_alive()
        assert result["c"].finish_reason == "cancelled"
        assert result["c"].token_ids == []
        print(f"cancel latency: {latency * 1e3:.0f} ms")
        assert latency < 0.5
        # the cache holds exactly the chunks finished before the cancel, and stays usable
        assert cache_consistent(llm)
        after = llm.complete("The capital of France is", temperature=0, max_tokens=3)
        assert after.finish_reason == "length" and len(after.token_ids) == 3


def test_cancel_during_generation(tiny):
    stream = tiny.complete("a", max_tokens=400, temperature=1.0, seed=2, stream=True)
    next(stream)
    tiny.cancel()
    *_, last = stream
    assert last.finish_reason == "cancelled"
    assert len(last.completion.token_ids) < 400
    assert tiny.complete("a", max_tokens=2, seed=2).finish_reason in ("length", "stop")


def _token_prompts(n: int) -> list[list[int]]:
    # distinct first tokens: no request reuses another's cache, so results are exact
    return [[40 + i, 60 + i, 80 + i, 100 + i] for i in range(n)]


def test_one_llm_from_two_threads_serialises(tiny):
    prompts = _token_prompts(6)
    alone = [tiny.complete(p, temperature=0.9, seed=7, max_tokens=25).token_ids for p in prompts]
    results: dict[int, list[int]] = {}

    def worker(indices):
        for i in indices:
            results[i] = tiny.complete(prompts[i], temperature=0.9, seed=7, max_tokens=25).token_ids

    threads = [threading.Thread(target=worker, args=(range(k, 6, 2),)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(6)] == alone
    assert cache_consistent(tiny)


def test_two_llms_in_two_threads_at_once():
    prompts = _token_prompts(3)
    with make(TINY) as a, make(ARCH / "gemma3.gguf") as b:
        alone = {name: [m.complete(p, temperature=0, max_tokens=30).token_ids for p in prompts]
                 for name, m in (("a", a), ("b", b))}
        results: dict[str, list] = {}
        threads = [threading.Thread(target=lambda n=name, m=m: results.__setitem__(
            n, [m.complete(p, temperature=0, max_tokens=30).token_ids for p in prompts]))
            for name, m in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == alone


def test_second_request_in_the_same_thread_while_streaming_is_an_error(tiny):
    stream = tiny.complete("a", max_tokens=50, stream=True)
    next(stream)
    with pytest.raises(RuntimeError, match="unfinished streamed request"):
        tiny.complete("b", max_tokens=2)
    stream.close()
    assert tiny.complete("b", max_tokens=2).finish_reason in ("length", "stop")


# -- lifetime

def _mapped(path) -> bool:
    return str(Path(path).resolve()) in Path("/proc/self/maps").read_text()


def test_close_releases_the_memory_map(tiny_copy):
    llm = make(tiny_copy)
    llm.complete("Hi", max_tokens=2)
    assert _mapped(tiny_copy)
    llm.close()
    assert not _mapped(tiny_copy)
    llm.close()                                  # twice is fine
    with pytest.raises(Error, match="closed"):
        llm.complete("Hi", max_tokens=2)
    with make(tiny_copy) as other:
        other.complete("Hi", max_tokens=1)
    assert not _mapped(tiny_copy)


def test_close_during_a_stream_in_another_thread(tiny_copy):
    llm = make(tiny_copy)
    stream = llm.complete("a", max_tokens=300, stream=True, seed=1)
    next(stream)
    closer = threading.Thread(target=llm.close)
    closer.start()
    closer.join()
    assert _mapped(tiny_copy)                    # the suspended stream still holds the model
    *_, last = stream
    assert last.finish_reason == "cancelled"
    assert not _mapped(tiny_copy)                # freed when the stream ended


@pytest.fixture
def tiny_copy(tmp_path):
    # a private copy, so the map check sees only this test's LLM
    path = tmp_path / "tiny.gguf"
    path.write_bytes(TINY.read_bytes())
    return path


def test_interpreter_shutdown_with_live_objects_is_silent(tmp_path):
    script = f"""
import gguflm
llm = gguflm.LLM({str(TINY)!r}, n_ctx=256, n_threads=1, progress=False)
stream = llm.complete("a", max_tokens=50, stream=True)
next(stream)
other = gguflm.LLM({str(TINY)!r}, n_ctx=256, n_threads=1, progress=False)
cycle = [other]
cycle.append(cycle)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_load_progress_callback_reaches_llm(tiny_copy):
    seen: list[float] = []
    with LLM(tiny_copy, n_ctx=256, n_threads=1, progress=seen.append) as llm:
        assert llm.complete("a", max_tokens=1).finish_reason in ("length", "stop")
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)
    with pytest.raises(LoadCancelled):
        LLM(tiny_copy, n_ctx=256, progress=lambda fraction: fraction < 0.5)
    assert not _mapped(tiny_copy)


def test_nothing_is_printed_only_logged(tiny, capfd):
    tiny.complete("abc", max_tokens=5)
    list(tiny.complete("abc", max_tokens=5, stream=True))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# -- the chat API

def test_chat_reuses_the_conversation_prefix(smol):
    messages = [{"role": "user", "content": "Name a color."}]
    first = smol.chat(messages, temperature=0, max_tokens=8)
    assert first.text and first.finish_reason in ("stop", "length")
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "Another one?"}]
    second = smol.chat(messages, temperature=0, max_tokens=8)
    assert second.timings.prompt_cached > len(first.prompt_tokens) // 2


def test_chat_without_template_names_the_model():
    with make(TINY) as llm:
        with pytest.raises(ChatTemplateError, match="tiny-llama"):
            llm.chat([{"role": "user", "content": "hi"}])


def test_default_model_chats_through_the_gemma_fallback(gemma_path, monkeypatch):
    monkeypatch.setenv("GGUFLM_MODELS", str(gemma_path.parent))
    with LLM(n_ctx=512, n_threads=1, progress=False) as llm:
        assert Path(llm.model_path) == gemma_path
        prompt = llm.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        reply = llm.chat([{"role": "user", "content": "Hi"}], max_tokens=4, seed=1)
        assert reply.prompt_tokens[0] == llm.token_bos()
        assert reply.prompt_tokens.count(llm.token_bos()) == 1
        assert len(reply.token_ids) >= 1


# -- llama-cpp-python's dicts

def _check_completion(d: dict, text_required: bool = True) -> None:
    assert set(d) == {"id", "object", "created", "model", "choices", "usage"}
    assert d["id"].startswith("cmpl-") and d["object"] == "text_completion"
    assert isinstance(d["created"], int) and abs(d["created"] - time.time()) < 600
    (choice,) = d["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    assert isinstance(choice["text"], str) and (choice["text"] or not text_required)
    usage = d["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_create_completion_dict_field_by_field(smol, smollm_path):
    d = smol.create_completion("The capital of France is", max_tokens=6, temperature=0, logprobs=2)
    _check_completion(d)
    assert d["model"] == str(smollm_path)
    assert d["usage"]["prompt_tokens"] == 5 and d["usage"]["completion_tokens"] == 6
    assert d["choices"][0]["finish_reason"] == "length"
    lp = d["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert "".join(lp["tokens"]) == d["choices"][0]["text"]
    assert lp["text_offset"][0] == len("The capital of France is")
    assert all(len(top) >= 2 and max(top.values()) == lp["token_logprobs"][i]
               for i, top in enumerate(lp["top_logprobs"]))
    echo = smol("The capital of France is", max_tokens=3, temperature=0, echo=True, model="m")
    assert echo["choices"][0]["text"].startswith("The capital of France is")
    assert echo["model"] == "m"


def test_stream_chunk_dicts_concatenate_to_the_completion(smol):
    smol.reset()
    whole = smol.create_completion("Once upon a time", max_tokens=12, seed=4)
    smol.reset()
    chunks = list(smol.create_completion("Once upon a time", max_tokens=12, seed=4, stream=True))
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert c["object"] == "text_completion" and c["id"] == chunks[0]["id"]
        assert set(c["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["text"] == ""
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_chat_completion_dicts_field_by_field(smol):
    messages = [{"role": "user", "content": "Say hello."}]
    smol.reset()
    d = smol.create_chat_completion(messages, max_tokens=10, seed=3, logprobs=True, top_logprobs=2)
    assert set(d) == {"id", "object", "created", "model", "choices", "usage"}
    assert d["id"].startswith("chatcmpl-") and d["object"] == "chat.completion"
    (choice,) = d["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    for c in content:
        assert set(c) == {"token", "bytes", "logprob", "top_logprobs"}
        assert len(c["top_logprobs"]) == 2
    smol.reset()
    chunks = list(smol.create_chat_completion(messages, max_tokens=10, seed=3, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"]
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == choice["message"]["content"]


def _shape(value):
    """A value's structure: dict keys and element shapes, with leaf types."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, (float, np.floating)):
        return "float"      # llama-cpp-python leaks numpy float32 into its logprobs
    return type(value).__name__ if value is not None else None


def test_dict_shapes_equal_llama_cpp_python(smol, smollm_path):
    llama_cpp = require_peer()
    ref = llama_cpp.Llama(str(smollm_path), n_ctx=512, n_threads=1, n_threads_batch=1,
                          verbose=False, logits_all=True)
    try:
        kwargs = {"max_tokens": 4, "temperature": 0}
        assert _shape(smol.create_completion("Hello", **kwargs)) == \
            _shape(ref.create_completion("Hello", **kwargs))
        assert _shape(smol.create_completion("Hello", logprobs=2, **kwargs)) == \
            _shape(ref.create_completion("Hello", logprobs=2, **kwargs))
        ours = [_shape(c) for c in smol.create_completion("Hello", stream=True, **kwargs)]
        theirs = [_shape(c) for c in ref.create_completion("Hello", stream=True, **kwargs)]
        assert ours[0] == theirs[0] and ours[-1] == theirs[-1]
        messages = [{"role": "user", "content": "Hi"}]
        assert _shape(smol.create_chat_completion(messages, **kwargs)) == \
            _shape(ref.create_chat_completion(messages, **kwargs))
        ours = [_shape(c) for c in smol.create_chat_completion(messages, stream=True, **kwargs)]
        theirs = [_shape(c) for c in ref.create_chat_completion(messages, stream=True, **kwargs)]
        assert ours[:2] == theirs[:2] and ours[-1] == theirs[-1]
    finally:
        ref.close()


def test_unrelated_requests_in_a_row_equal_llama_cpp_python(smollm_path):
    """One LLM, no reset() between requests: a long prompt after a short unrelated one takes the
    cells llama.cpp's cache gives it (from cell 0, where seq_rm freed them; placed after the old
    request's cells its log-probabilities were 0.13 off), so the text, the log-probabilities and
    the positions the cache holds are llama-cpp-python's."""
    llama_cpp = require_peer()
    import llama_cpp.llama_cpp as L
    ref = llama_cpp.Llama(str(smollm_path), n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False,
                          logits_all=True)
    long = ("Rivers carry water from mountains to the sea, shaping valleys, feeding farms and cities, "
            "and giving homes to fish, birds and many other creatures along their banks. In short,")
    kwargs = {"max_tokens": 16, "temperature": 0.0, "repeat_penalty": 1.0, "logprobs": 1}
    try:
        with make(smollm_path, n_ctx=1024) as llm:
            for prompt in ["The capital of France is", long, "Hi", long]:
                ours, theirs = llm.create_completion(prompt, **kwargs), ref.create_completion(prompt, **kwargs)
                assert ours["choices"][0]["text"] == theirs["choices"][0]["text"], prompt
                np.testing.assert_allclose(ours["choices"][0]["logprobs"]["token_logprobs"],
                                           theirs["choices"][0]["logprobs"]["token_logprobs"], atol=1e-5)
                memory = L.llama_get_memory(ref._ctx.ctx)
                assert llm.context.memory.seq_pos_min(0) == L.llama_memory_seq_pos_min(memory, 0)
                assert llm.context.memory.seq_pos_max(0) == L.llama_memory_seq_pos_max(memory, 0)
    finally:
        ref.close()


def test_llama_cpp_python_constructor_arguments(tiny_copy):
    with LLM(str(tiny_copy), n_ctx=256, n_threads=1, n_gpu_layers=-1, verbose=False, use_mmap=False,
             chat_format="llama-2", last_n_tokens_size=32, logits_all=False, type_k=8, type_v=0,
             lora_path=None, progress=False) as llm:
        assert llm.model.load_mode == "none"
        assert (llm.context.type_k, llm.context.type_v) == ("q8_0", "f32")
        assert llm.chat_template == "llama-2" and llm.penalty_last_n == 32
        assert llm.apply_chat_template([{"role": "user", "content": "x"}]) == "[INST] x [/INST]"
        with pytest.raises(TypeError, match="grammar"):
            llm.create_completion("a", grammar=object())
        with pytest.raises(ValueError, match="suffix"):
            llm.create_completion("a", suffix="b")
    with pytest.raises(TypeError, match="n_gpus"):
        LLM(str(tiny_copy), n_gpus=3, progress=False)
    from gguflm.lora import LoraAdapterError   # LoRA itself: tests/test_lora_surfaces.py
    with pytest.raises(LoraAdapterError, match="adapter.gguf"):
        LLM(str(tiny_copy), lora_path="adapter.gguf", progress=False)


def test_bad_requests_raise_clear_errors(tiny):
    with pytest.raises(ValueError, match="exceed context window"):
        tiny.complete([10 + i % 300 for i in range(600)], max_tokens=1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.complete([5, 10_000])
    with pytest.raises(TypeError):
        tiny.complete(3.5)
    with pytest.raises(TypeError):
        tiny.complete("a", stop=[1])
    with pytest.raises(ValueError):
        tiny.complete("a", logprobs=-1)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        tiny.complete("a", max_tokens="many")
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        tiny.create_completion("a", max_tokens=2.5)
    assert tiny.complete("", max_tokens=2).prompt_tokens == [tiny.token_bos()]
    assert cache_consistent(tiny)


def test_max_tokens_none_runs_to_the_end_of_the_context(tiny_copy):
    with make(tiny_copy, n_ctx=256) as llm:
        never_end = {t: -1e9 for t in llm.model.vocab.eog_ids}
        out = llm.create_completion(list(range(10, 210)), max_tokens=None, temperature=1.0, seed=1,
                                    logit_bias=never_end)
        assert out["usage"]["total_tokens"] == llm.n_ctx()
        assert out["choices"][0]["finish_reason"] == "length"


def test_lazy_public_name():
    assert gguflm.LLM is LLM
