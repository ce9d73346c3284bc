"""generate_async / chat_async: the caller never waits, chunks arrive by callback, iterator or
asyncio, and cancel() stops within one decode step, also in the middle of a long prompt."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import gguflm


@pytest.fixture(scope="module")
def llm(smollm_path):
    with gguflm.LLM(smollm_path, n_ctx=2048, n_ubatch=64, n_threads=1, seed=7) as llm:
        yield llm


def test_same_result_as_the_blocking_call_without_blocking(llm):
    expected = llm.complete("The capital of France is", max_tokens=24, temperature=0)
    seen: list[str] = []
    on_worker: list[bool] = []
    t0 = time.perf_counter()
    gen = llm.generate_async("The capital of France is", max_tokens=24, temperature=0,
                             on_chunk=lambda c: (seen.append(c.text),
                                                 on_worker.append(threading.current_thread() is not threading.main_thread())))
    returned_after = time.perf_counter() - t0
    done: list[gguflm.background.Generation] = []
    result = gen.result(timeout=120)
    assert returned_after < 0.05          # tokenizing only; the request runs on the worker
    assert gen.done and result.text == expected.text and result.token_ids == expected.token_ids
    assert "".join(seen) == expected.text and all(on_worker)
    assert [c.text for c in gen] == seen  # the iterator replays every chunk
    gen2 = llm.chat_async([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                          on_done=done.append)
    gen2.wait(120)
    assert done == [gen2] and gen2.result().finish_reason == "length"


def test_cancel_stops_generation_within_a_step(llm):
    cancel_at: list[float] = []
    after_cancel: list[int] = []

    def on_chunk(chunk):
        if cancel_at:
            after_cancel.extend(chunk.token_ids)

    gen = llm.chat_async([{"role": "user", "content": "Tell me a long story about a dragon."}],
                         max_tokens=400, temperature=0, on_chunk=on_chunk)
    while not gen.text and not gen.done:
        time.sleep(0.005)
    cancel_at.append(time.perf_counter())
    gen.cancel()
    result = gen.result(timeout=60)
    stopped_in = time.perf_counter() - cancel_at[0]
    assert result.finish_reason == "cancelled"
    assert len(result.token_ids) < 400
    assert len(after_cancel) <= 1     # at most the token being decoded when cancel() came
    step = result.timings.gen_ms / 1e3 / max(1, result.timings.gen_n)
    assert stopped_in < 3 * step + 0.5   # slack for a loaded machine


def test_cancel_during_a_long_prompt(llm):
    llm.reset()
    prompt = list(range(1000, 2800))           # 1800 tokens: 29 ubatches of 64
    gen = llm.generate_async(prompt, max_tokens=8, temperature=0)
    time.sleep(0.2)
    t0 = time.perf_counter()
    gen.cancel()
    result = gen.result(timeout=60)
    stopped_in = time.perf_counter() - t0
    assert result.finish_reason == "cancelled" and result.token_ids == []
    # the prompt was not finished: the cache holds part of it
    assert llm.context.memory.seq_pos_max(0) < len(prompt) - 1
    # a ubatch of 64 tokens takes a fraction of the whole prompt's time
    whole = result.timings.prompt_ms / 1e3
    assert stopped_in < 0.5 and stopped_in < whole


def test_cancel_before_the_request_starts_leaves_the_running_one_alone(llm):
    first = llm.generate_async("Once upon a time", max_tokens=40, temperature=0)
    second = llm.generate_async("Hello", max_tokens=40, temperature=0)   # waits for the LLM
    second.cancel()
    assert first.result(timeout=120).finish_reason == "length"
    assert second.result(timeout=120).finish_reason == "cancelled"
    assert second.result().token_ids == []


def test_async_iteration_keeps_the_event_loop_free(llm):
    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        texts = []
        async for chunk in llm.generate_async("Count: one, two,", max_tokens=24, temperature=0):
            texts.append(chunk.text)
        stop.set()
        await task
        return texts, ticks

    texts, ticks = asyncio.run(main())
    expected = llm.complete("Count: one, two,", max_tokens=24, temperature=0).text
    assert "".join(texts) == expected
    assert ticks >= 3


def test_bad_arguments_raise_on_the_callers_thread(llm):
    with pytest.raises(ValueError, match="exceed context window"):
        llm.generate_async(list(range(10, 2100)))
    with pytest.raises(TypeError):
        llm.generate_async("Hi", stream=True)
    with pytest.raises(TypeError):
        llm.generate_async("Hi", no_such_option=1)


def test_a_failing_callback_does_not_stop_the_request(llm):
    def boom(chunk):
        raise RuntimeError("application bug")

    gen = llm.generate_async("Hi", max_tokens=5, temperature=0, on_chunk=boom)
    assert gen.result(timeout=60).finish_reason in ("length", "stop")
