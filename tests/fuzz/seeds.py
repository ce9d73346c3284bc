"""``python -m tests.fuzz.seeds``: (re)write the committed seed corpora from the tests' data.

Each target's seeds are a few dozen small inputs in its own input format (see each check's
docstring): the tests' grammars and schemas, llama.cpp's tokenizer-suite texts, the built-in chat
templates, tiny GGUF files of ``tests/tiny_models.py``'s vocabularies and a tiny model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from gguflm import quants
from gguflm.chat import BUILTIN_TEMPLATES

from . import CORPUS_DIR, TARGETS
from .grammars import match_vocab
from .tokenizers import DETOKENIZE_VOCABS, VOCAB_DIR

TESTS = Path(__file__).resolve().parents[1]
GRAMMAR_DATA = TESTS / "data" / "grammar"
SUITE_SEPARATOR = b"\n__ggml_vocab_test__\n"
MAX_SEEDS = 48


def _json(name: str) -> object:
    return json.loads((GRAMMAR_DATA / name).read_text())


def _gguf_files() -> list[bytes]:
    """A tiny llama model and metadata-only vocabularies of the tiny models' kinds."""
    from tests.tiny_models import (TinyModel, TinyRwkv, add_plamo2_vocab, add_rwkv_vocab,
                                   add_vocab, write_tiny_model, write_tiny_rwkv)
    from gguflm.gguf import GGUFWriter

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        write_tiny_model(TinyModel(arch="llama", n_embd=32, head_dim=8, n_head=4, n_head_kv=2,
                                   n_ff=32, n_layer=1), path, np.random.default_rng(0))
        out.append(path.read_bytes())
        write_tiny_rwkv(TinyRwkv(n_embd=32, n_layer=1, head_size=16, n_ff=32, lora_rank=4), path,
                        np.random.default_rng(0))
        out.append(path.read_bytes())
        for add in (add_vocab, add_rwkv_vocab, add_plamo2_vocab):
            w = GGUFWriter(path, arch="llama")
            add(w)
            w.write()
            out.append(path.read_bytes())
    return out


def _suite_texts(limit: int = 24) -> list[bytes]:
    texts = sorted({t for inp in sorted(VOCAB_DIR.glob("*.inp"))
                    for t in inp.read_bytes().split(SUITE_SEPARATOR) if len(t) < 400})
    return texts[::max(1, len(texts) // limit)][:limit]


def seeds() -> dict[str, list[bytes]]:
    parser, cases = _json("parser.json"), _json("integration.json")["cases"]
    converted = _json("json_schema_to_grammar.json")
    grammars = ([c["source"] for c in cases if c["kind"] == "grammar"] + parser["failures"]
                + [p["grammar"] for p in parser["parses"]] + [c["grammar"] for c in converted if c.get("grammar")])
    schemas = [c["source"] for c in cases if c["kind"] == "schema"] + [c["schema"] for c in converted]
    vocab = match_vocab()
    matches = []
    for c in cases:
        if c["kind"] != "grammar":
            continue
        for text in c["passing"][:2] + c["failing"][:1]:
            ids = vocab.tokenize(text, add_special=False)
            matches.append(c["source"].encode() + b"\0" + np.array(ids, "<u2").tobytes())
    messages = "\0".join(["You are helpful.", "Hi <s> there", "Hello! {{ 7*7 }}", "{\"x\": 1}"])
    templates = [(b.source + "\0" + messages).encode() for b in BUILTIN_TEMPLATES.values()]
    templates += [b"{{ messages[0].content | upper }}\0hi", b"{% for m in messages %}{{ m.role }}{% endfor %}\0a\0b",
                  b"{{ ''.__class__ }}", b"{{ 'x' * 3 }}{{ 2 ** 10 }}", b"{{ raise_exception('no') }}"]
    texts = _suite_texts()
    tokenize = [bytes([i % 7, i % 4]) + t for i, t in enumerate(texts)]
    rng = np.random.default_rng(0)
    detok = [bytes([v, f]) + rng.integers(0, 400, 6, dtype="<i4").tobytes()
             for v in range(len(DETOKENIZE_VOCABS)) for f in (0, 3)]
    formats = quants.formats()
    quant = [bytes([i, flags]) + rng.integers(0, 256, 96, dtype=np.uint8).tobytes()
             for i in range(len(formats)) for flags in (0, 48)]
    bodies = [
        (0, {"prompt": "Hello", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}),
        (1, {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}),
        (1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
             "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        (1, {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}}),
        (2, {"input": "hello", "instructions": "be brief", "max_output_tokens": 5}),
        (2, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}),
        (3, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "system": "s"}),
        (4, {"input": ["a", "b"], "encoding_format": "base64"}),
        (5, {"content": ["ab", 5, "c"], "with_pieces": True}),
        (6, {"tokens": [1, 2, 300]}),
    ]
    server = [bytes([e]) + json.dumps(b).encode() for e, b in bodies]
    return {
        "gguf_reader": _gguf_files(), "vocab_only": _gguf_files()[2:],
        "gbnf": [g.encode() for g in grammars], "json_schema_py": [s.encode() for s in schemas],
        "json_schema_cpp": [s.encode() for s in schemas], "grammar_match": matches,
        "chat_template": templates, "tokenize_spm": tokenize, "tokenize_bpe": tokenize,
        "tokenize_wpm": tokenize, "tokenize_ugm": tokenize, "tokenize_rwkv": tokenize,
        "detokenize": detok, "quants": quant, "server_requests": server,
    }


def main() -> None:
    corpora = seeds()
    assert set(corpora) == set(TARGETS)
    for target, items in corpora.items():
        folder = CORPUS_DIR / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for data in list(dict.fromkeys(items))[:MAX_SEEDS]:
            (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)
        print(f"{target}: {len(list(folder.iterdir()))} seeds")


if __name__ == "__main__":
    main()
