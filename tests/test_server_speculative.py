"""The server's speculative decoding, per slot as llama-server's: each slot drafts on its own
(prompt lookup, or a draft model's context), drafts of several slots are checked in one batch,
and with the server's f32 cache the replies are those of the server without drafts, greedy or
seeded, stop strings and length limits included."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
from gguflm.cli import _speculative, build_parser  # noqa: E402
from gguflm.errors import SpeculationError  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from gguflm.speculative import PromptLookup, SlotSpeculation, Speculation  # noqa: E402
from test_server import NO_PENALTY, Served  # noqa: E402

# text the model goes on copying, so drafts are taken; and a stop string inside the copy
PROMPTS = ["def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
           "red, green, blue, yellow, red, green, blue, yellow, red, green,"]
REQUESTS = [dict(prompt=PROMPTS[0], max_tokens=40, temperature=0),
            dict(prompt=PROMPTS[1], max_tokens=33, temperature=0, stop=["red, green, blue, yellow, green"]),
            dict(prompt=PROMPTS[1], max_tokens=24, temperature=0.9, seed=7)]


def replies(smollm_path: Path, **draft) -> tuple[list[tuple[str, int, str]], dict]:
    """The requests' (text, completion tokens, finish reason), the first two at once, and the
    scheduler's draft counters."""
    s = Served(create_app(smollm_path, parallel=2, n_ctx=1024, n_threads=1, **draft))
    try:
        client = s.client()
        out: dict[int, tuple[str, int, str]] = {}

        def ask(i: int) -> None:
            r = client.completions.create(model="m", extra_body=NO_PENALTY, **REQUESTS[i])
            out[i] = (r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason)

        threads = [threading.Thread(target=ask, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ask(2)
        status, slots = s.json("GET", "/slots")
        assert status == 200 and all(slot["speculative"] == bool(draft) for slot in slots)
        stats = s.scheduler.stats
        return [out[i] for i in range(3)], {"drafted": stats.drafted_tokens, "accepted": stats.drafted_accepted,
                                            "widest": max(stats.batch_tokens)}
    finally:
        s.close()


@pytest.fixture(scope="module")
def plain(smollm_path):
    return replies(smollm_path)


def test_prompt_lookup_per_slot_gives_the_same_replies(smollm_path, plain):
    expected, counts = plain
    assert counts["drafted"] == 0
    got, counts = replies(smollm_path, draft_model=PromptLookup(2, 8), draft_max=8)
    assert got == expected
    assert expected[1][2] == "stop" and expected[0][1] == 40     # the stop string and the length held
    assert counts["accepted"] > 0 and counts["drafted"] >= counts["accepted"]
    assert counts["widest"] > 2     # drafted rows shared the batch with the slots' own tokens


def test_draft_model_per_slot_gives_the_same_replies(smollm_path, plain):
    expected, _ = plain
    # the model drafting for itself: the same vocabulary, and drafts it mostly takes
    got, counts = replies(smollm_path, draft_model=str(smollm_path), draft_max=4, draft_p_min=0.0)
    assert got == expected
    assert counts["accepted"] > counts["drafted"] // 2


def test_slot_speculation_refuses_shared_state_and_router_mode(smollm_path, tmp_path):
    with pytest.raises(SpeculationError):
        SlotSpeculation(Speculation(PromptLookup()), None, 2)
    lookups = SlotSpeculation(PromptLookup(3, 5), None, 2, n_max=4)
    try:
        a, b = (s.proposer for s in lookups.slots)
        assert a is not b and (a.max_ngram_size, a.num_pred_tokens) == (3, 5)
    finally:
        lookups.close()
    with pytest.raises(ValueError, match="one model"):
        create_app(models=[smollm_path], draft_model=PromptLookup())


def test_serve_takes_llama_server_draft_flags():
    args = build_parser().parse_args(["serve", "--spec-type", "ngram", "--spec-ngram-size", "3", "--draft-max", "6",
                                      "--draft-min", "2"])
    options = _speculative(args)
    assert isinstance(options["draft_model"], PromptLookup) and options["draft_model"].max_ngram_size == 3
    assert (options["draft_max"], options["draft_min"]) == (6, 2)
