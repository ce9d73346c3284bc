"""llama-server's slot endpoints: ``GET /slots`` (each slot's state) and
``POST /slots/{id}?action=save|restore|erase`` (a slot's cache to a file of ``--slot-save-path``
and back, or forgotten).

A saved slot is the sequence's state file (:meth:`gguflm.context.Context.state_seq_save`, with the
cached tokens in it); restoring puts its cells back into the slot's region and its tokens into
the slot, so the next request whose prompt starts with them decodes only the rest, and goes on
as it would have without the save. Each action runs in the scheduler's thread between two decode
steps; on a slot that is generating it waits until the slot is free (as llama-server defers it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gguflm.errors import Error
from gguflm.server.protocol import RequestError

__all__ = ["valid_filename", "slot_json", "save", "restore", "erase", "ACTIONS"]

# characters llama.cpp refuses in a file name (besides controls): Windows' reserved ones and their
# Unicode look-alikes, the replacement character and the byte order mark
_FORBIDDEN = frozenset(':*?"<>|/\\') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def valid_filename(name: Any) -> bool:
    """A plain file name as llama.cpp's ``fs_validate_filename`` accepts it: no directories, no
    ``..``, no control or reserved characters, no leading or trailing space or trailing dot."""
    if not isinstance(name, str) or not 0 < len(name.encode("utf-8", "surrogatepass")) <= 255:
        return False
    for c in name:
        code = ord(c)
        if code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF or c in _FORBIDDEN:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name)


def slot_json(slot: Any, n_ctx_slot: int, vocab: Any) -> dict[str, Any]:
    """One slot of ``GET /slots`` in llama-server's fields: about its running task, or else the
    last one it ran."""
    out: dict[str, Any] = {"id": slot.index, "n_ctx": n_ctx_slot, "speculative": slot.speculation is not None,
                           "is_processing": slot.task is not None}
    task, gen = (slot.task, slot.gen) if slot.task is not None else slot.last
    if task is None:
        return out
    request = gen.request
    prompt = task.prepared.tokens
    n_cached = slot.n_cached
    n_remain = max(0, request.max_tokens - len(gen.generated))
    generated = vocab.detokenize(gen.generated)
    out.update({
        "id_task": task.id,
        "n_prompt_tokens": len(slot.session.tokens),
        "n_prompt_tokens_processed": max(0, min(len(slot.session.tokens), len(prompt)) - n_cached),
        "n_prompt_tokens_cache": n_cached,
        "params": {"n_predict": request.max_tokens, "stop": list(request.stop),
                   "n_probs": request.n_logprobs or 0, "stream": False},
        "next_token": [{"has_next_token": slot.task is not None and gen.finish is None,
                        "has_new_line": "\n" in generated,
                        "n_remain": n_remain, "n_decoded": len(gen.generated)}],
        "prompt": vocab.detokenize(prompt, unparse_special=True),
        "generated": generated,
    })
    return out


def _path(save_dir: Path, body: Any) -> tuple[str, Path]:
    filename = body.get("filename") if isinstance(body, dict) else None
    if not valid_filename(filename):
        raise RequestError("Invalid filename", param="filename")
    return filename, save_dir / filename


def save(scheduler: Any, slot: Any, save_dir: Path, body: Any) -> dict[str, Any]:
    """``action=save``: the slot's sequence and cached tokens to ``save_dir / filename``."""
    filename, path = _path(save_dir, body)
    t0 = time.perf_counter()
    tmp = path.with_name(f".{filename}.tmp")     # a reader never sees half a file
    try:
        data = scheduler.ctx.state_seq_save(slot.index, tmp, tokens=slot.session.tokens)
        os.replace(tmp, path)
    except OSError as exc:
        raise RequestError(f"Unable to save slot: {exc.strerror or exc}", status=500,
                           type="server_error") from None
    return {"id_slot": slot.index, "filename": filename, "n_saved": len(slot.session.tokens),
            "n_written": len(data), "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def restore(scheduler: Any, slot: Any, save_dir: Path, body: Any) -> dict[str, Any]:
    """``action=restore``: a saved sequence into the slot (its old cells freed first)."""
    filename, path = _path(save_dir, body)
    t0 = time.perf_counter()
    if not path.is_file():
        raise RequestError(f"Unable to restore slot: no saved slot named {filename!r}",
                           param="filename", status=404, type="not_found_error")
    n_read = path.stat().st_size
    try:
        tokens = scheduler.ctx.state_seq_load(path, slot.index)
    except (Error, OSError, ValueError) as exc:
        raise RequestError(f"Unable to restore slot: {exc}", param="filename") from None
    n_vocab = scheduler.vocab.n_tokens
    if len(tokens) > scheduler.n_ctx_slot or any(not 0 <= t < n_vocab for t in tokens):
        slot.session.reset()
        raise RequestError("Unable to restore slot: its tokens do not fit this slot or model",
                           param="filename")
    slot.session.tokens = tokens
    slot.n_cached = 0
    return {"id_slot": slot.index, "filename": filename, "n_restored": len(tokens),
            "n_read": n_read, "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def erase(scheduler: Any, slot: Any, save_dir: Path, body: Any) -> dict[str, Any]:
    """``action=erase``: forget the slot's cache."""
    n_erased = len(slot.session.tokens)
    slot.session.reset()
    return {"id_slot": slot.index, "n_erased": n_erased}


ACTIONS = {"save": save, "restore": restore, "erase": erase}
