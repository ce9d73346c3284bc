"""Streaming text assembly: whole UTF-8 characters only, stop strings honoured across chunk
boundaries and never leaked (property tests; no model needed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gguflm.generate import TextAssembler

SETTINGS = settings(max_examples=150, deadline=None)

# emoji, CJK, accents and ASCII, so that many characters span 2-4 bytes
alphabet = st.sampled_from([*"ab ,.\n", "é", "ß", "中", "文", "😀", "🎉", "👍🏽", "Ж"])
texts = st.lists(alphabet, max_size=40).map("".join)
stops = st.lists(st.lists(alphabet, min_size=1, max_size=4).map("".join), max_size=3)


def split_bytes(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def stream(text: str, cuts: list[int], stop: list[str]) -> tuple[list[str], bool]:
    assembler = TextAssembler(stop)
    out = []
    for piece in split_bytes(text.encode(), cuts):
        out.append(assembler.push(piece))
        if assembler.stopped:
            break
    out.append(assembler.flush())
    return out, assembler.stopped


def expected(text: str, cuts: list[int], stop: list[str]) -> tuple[str, bool]:
    """Generation stops at the first chunk after which the text so far contains a stop string;
    the output is that text cut before the earliest stop string in it (as llama-cpp-python cuts).
    A stop string that would only complete later cannot win: generation has ended by then."""
    seen = b""
    for piece in split_bytes(text.encode(), cuts):
        seen += piece
        so_far = seen.decode("utf-8", errors="ignore")   # whole characters only
        hits = [i for i in (so_far.find(s) for s in stop if s) if i >= 0]
        if hits:
            return so_far[:min(hits)], True
    return text, False


@SETTINGS
@given(text=texts, cuts=st.lists(st.integers(0, 400), max_size=30), stop=stops)
def test_stream_is_text_up_to_first_stop(text, cuts, stop):
    out, stopped = stream(text, cuts, stop)
    want, want_stopped = expected(text, cuts, stop)
    assert "".join(out) == want
    assert stopped == want_stopped


@SETTINGS
@given(text=texts, cuts=st.lists(st.integers(0, 400), max_size=30), stop=stops)
def test_chunks_hold_whole_characters_and_no_stop_text(text, cuts, stop):
    out, _ = stream(text, cuts, stop)
    released = ""
    for chunk in out:
        assert "\ufffd" not in chunk            # no character was cut
        released += chunk
        assert text.startswith(released)        # never text that is not in the stream
        for s in stop:
            if s:
                assert s not in released        # a stop string never reaches the user


@SETTINGS
@given(text=texts, cuts=st.lists(st.integers(0, 400), max_size=30))
def test_without_stops_everything_complete_is_released_at_once(text, cuts):
    """With no stop strings nothing is held back but the bytes of an unfinished character."""
    assembler = TextAssembler()
    data = text.encode()
    sent = 0
    released = ""
    for piece in split_bytes(data, cuts):
        released += assembler.push(piece)
        sent += len(piece)
        assert released == data[:sent].decode("utf-8", "ignore")


def test_held_prefix_is_released_when_it_does_not_complete_a_stop():
    assembler = TextAssembler(["STOP"])
    assert assembler.push(b"abc ST") == "abc "
    assert assembler.push(b"OR") == "STOR"      # not a stop after all
    assert assembler.push(b" ST") == " "
    assert assembler.flush() == "ST"            # end of generation releases the held tail
    assert not assembler.stopped


def test_truncated_character_at_the_end_becomes_replacement_char():
    assembler = TextAssembler()
    assert assembler.push("a😀".encode()[:3]) == "a"
    assert assembler.flush() == "\ufffd"
