"""Constrained generation end to end, side by side with llama-cpp-python on both real models: a
dozen grammars and JSON schemas, greedy, as text completions and as chat completions; the same
text must come out. JSON answers must parse and satisfy their schema (the ``jsonschema``
validator). Forced tool calls must have llama-cpp-python's shapes; the CLI flags must constrain.

Every LLM here uses one thread (the suite shares small machines).
"""

from __future__ import annotations

import json

import pytest

import gguflm
from gguflm.grammar import Grammar
from gguflm.grammar.builtin import JSON_GBNF
from gguflm.llm import LLM
from _llama import require_peer

jsonschema = pytest.importorskip("jsonschema")

GBNF = {
    "json": JSON_GBNF,
    "yes-no": 'root ::= "Yes" | "No"',
    "date": 'root ::= [0-9]{4} "-" [0-1] [0-9] "-" [0-3] [0-9]',
    "list": 'root ::= ("- " [a-zA-Z ]{1,20} "\\n"){2,3}',
    "arithmetic": 'root ::= num " " [-+*/] " " num " = " num\nnum ::= [1-9] [0-9]{0,2}',
    "emoji": 'root ::= [\\U0001F300-\\U0001FAFF]{1,3} " " [a-z]{2,8}',
}
# schemas whose grammar is llama-cpp-python's exactly (no integer bounds: gguflm honours those,
# llama-cpp-python drops them; see test_bounded_integers_are_honoured)
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False},
    "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
               "maxItems": 3},
    "word": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
    "choice": {"anyOf": [{"type": "boolean"}, {"enum": [1, 2, 3]}]},
    "event": {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                               "ok": {"type": "boolean"}},
              "required": ["day", "ok"]},
    "tree": {"$defs": {"leaf": {"type": "object", "properties": {
        "id": {"type": "integer"}}, "required": ["id"]}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/leaf"},
                                         "tag": {"enum": ["x", "y"]}},
        "required": ["root", "tag"]},
}
PROMPT = "Answer in the requested format. Example answer:"
MESSAGES = [{"role": "user", "content": "Give me an example answer."}]


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def engines(request, smollm_path, gemma_path):
    llama_cpp = require_peer()
    path = {"smollm": smollm_path, "gemma": gemma_path}[request.param]
    # Gemma's file has no chat template: both engines are given the gemma format
    chat_format = "gemma" if request.param == "gemma" else None
    ours = LLM(path, n_ctx=512, n_threads=1, progress=False, chat_format=chat_format)
    theirs = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, n_threads_batch=1,
                             verbose=False, chat_format=chat_format)
    yield request.param, ours, theirs, llama_cpp
    ours.close()
    theirs.close()


def _fresh(ours, theirs) -> None:
    """Forget both caches: a reused prefix would change batch shapes, and llama.cpp's logits
    move with them (by ~1e-3), enough to turn a greedy choice now and then."""
    ours.reset()
    theirs.reset()


def _both_grammars(llama_cpp, text: str):
    return gguflm.LlamaGrammar.from_string(text), llama_cpp.LlamaGrammar.from_string(
        text, verbose=False)


def _check_json(text: str, schema: dict) -> None:
    # llama-cpp-python's string rule admits raw control characters: non-strict JSON reading
    jsonschema.validate(json.loads(text, strict=False), schema)


@pytest.mark.parametrize("name", GBNF)
def test_grammar_completions_equal_llama_cpp_python(engines, name):
    model, ours, theirs, llama_cpp = engines
    mine, ref = _both_grammars(llama_cpp, GBNF[name])
    kwargs = {"max_tokens": 20, "temperature": 0}
    _fresh(ours, theirs)
    a = ours.create_completion(PROMPT, grammar=mine, **kwargs)
    b = theirs.create_completion(PROMPT, grammar=ref, **kwargs)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"] == b["usage"]
    assert Grammar(GBNF[name]).compile(ours.model.vocab)   # the text parses as the grammar
    _fresh(ours, theirs)
    a = ours.create_chat_completion(MESSAGES, grammar=mine, **kwargs)
    b = theirs.create_chat_completion(MESSAGES, grammar=ref, **kwargs)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_completions_equal_llama_cpp_python_and_validate(engines, name):
    model, ours, theirs, llama_cpp = engines
    schema = SCHEMAS[name]
    text = json.dumps(schema)
    kwargs = {"max_tokens": 48, "temperature": 0}
    _fresh(ours, theirs)
    a = ours.create_completion(PROMPT, grammar=gguflm.LlamaGrammar.from_json_schema(text),
                               **kwargs)
    b = theirs.create_completion(PROMPT, grammar=llama_cpp.LlamaGrammar.from_json_schema(
        text, verbose=False), **kwargs)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] == "stop"
    _check_json(a["choices"][0]["text"], schema)
    fmt = {"type": "json_object", "schema": schema}
    _fresh(ours, theirs)
    a = ours.create_chat_completion(MESSAGES, response_format=fmt, **kwargs)
    b = theirs.create_chat_completion(MESSAGES, response_format=fmt, **kwargs)
    content = a["choices"][0]["message"]["content"]
    assert content == b["choices"][0]["message"]["content"]
    assert a["choices"][0]["finish_reason"] == "stop"
    _check_json(content, schema)
    # OpenAI's shape converts the same way (llama-cpp-python ignores it: compared with the above)
    ours.reset()
    c = ours.create_chat_completion(MESSAGES, response_format={
        "type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        **kwargs)
    assert c["choices"][0]["message"]["content"] == content


def test_bounded_integers_are_honoured(engines):
    model, ours, theirs, llama_cpp = engines
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3,
                                                     "maximum": 7}}, "required": ["n"]}
    out = ours.chat(MESSAGES, grammar=Grammar.from_json_schema(schema), max_tokens=24,
                    temperature=0)
    assert out.finish_reason == "stop"
    _check_json(out.text, schema)


def test_json_object_without_schema(engines):
    model, ours, theirs, llama_cpp = engines
    kwargs = {"max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}}
    _fresh(ours, theirs)
    a = ours.create_chat_completion(MESSAGES, **kwargs)
    b = theirs.create_chat_completion(MESSAGES, **kwargs)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def test_forced_tool_call_equals_llama_cpp_python(engines):
    model, ours, theirs, llama_cpp = engines
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kwargs = {"max_tokens": 48, "temperature": 0, "tools": TOOLS,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    _fresh(ours, theirs)
    a = ours.create_chat_completion(messages, **kwargs)
    b = theirs.create_chat_completion(messages, **kwargs)
    assert _shape(a) == _shape(b)
    call, ref = a["choices"][0]["message"], b["choices"][0]["message"]
    assert call["tool_calls"][0]["function"] == ref["tool_calls"][0]["function"]
    assert call["function_call"] == ref["function_call"]
    assert a["choices"][0]["finish_reason"] == "tool_calls" and call["content"] is None
    assert call["tool_calls"][0]["id"] == f"call__0_get_weather_{a['id'][len('chat'):]}"
    _check_json(call["tool_calls"][0]["function"]["arguments"],
                TOOLS[0]["function"]["parameters"])
    _fresh(ours, theirs)
    chunks = list(ours.create_chat_completion(messages, stream=True, **kwargs))
    ref_chunks = list(theirs.create_chat_completion(messages, stream=True, **kwargs))
    assert [_shape(c) for c in chunks[:2]] == [_shape(c) for c in ref_chunks[:2]]
    assert _shape(chunks[-1]) == _shape(ref_chunks[-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    streamed = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                       for c in chunks if c["choices"][0]["delta"].get("tool_calls"))
    assert streamed == call["tool_calls"][0]["function"]["arguments"]


def test_tool_choice_auto_and_none_constrain_nothing(engines):
    model, ours, theirs, llama_cpp = engines
    for choice in ("auto", "none"):
        a = ours.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=8,
                                        temperature=0)
        assert "tool_calls" not in a["choices"][0]["message"]
    with pytest.raises(ValueError, match="not found"):
        ours.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "missing"}})


def test_native_api_and_shims_agree(engines):
    model, ours, theirs, llama_cpp = engines
    grammar = Grammar.from_json_schema(SCHEMAS["colors"])
    native = ours.complete(PROMPT, grammar=grammar, max_tokens=30, temperature=0)
    shim = ours.create_completion(PROMPT, grammar=gguflm.LlamaGrammar.from_json_schema(
        json.dumps(SCHEMAS["colors"])), max_tokens=30, temperature=0)
    peer_object = ours.create_completion(PROMPT, grammar=llama_cpp.LlamaGrammar.from_json_schema(
        json.dumps(SCHEMAS["colors"]), verbose=False), max_tokens=30, temperature=0)
    assert native.text == shim["choices"][0]["text"] == peer_object["choices"][0]["text"]
    streamed = "".join(c.text for c in ours.complete(PROMPT, grammar=grammar, max_tokens=30,
                                                     temperature=0, stream=True))
    assert streamed == native.text


def test_sampled_constrained_output_always_fits(engines):
    model, ours, theirs, llama_cpp = engines
    schema = SCHEMAS["person"]
    for seed in range(3):
        out = ours.chat(MESSAGES, grammar=Grammar.from_json_schema(schema), max_tokens=64,
                        temperature=1.0, seed=seed)
        if out.finish_reason == "stop":
            _check_json(out.text, schema)


def test_cli_flags_constrain_the_output(smollm_path, tmp_path, capsys):
    from gguflm.cli import main

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS["colors"]))
    grammar = tmp_path / "g.gbnf"
    grammar.write_text(GBNF["yes-no"])
    base = ["run", "-m", str(smollm_path), "-p", PROMPT, "-n", "24", "--temp", "0", "-q", "-t",
            "1", "--no-display-prompt"]
    assert main(base + ["-jf", str(schema)]) == 0
    _check_json(capsys.readouterr().out.strip(), SCHEMAS["colors"])
    assert main(base + ["--grammar-file", str(grammar)]) == 0
    assert capsys.readouterr().out.strip() in ("Yes", "No")
    assert main(base + ["--grammar", 'root ::= "ok" [!.]']) == 0
    assert capsys.readouterr().out.strip() in ("ok!", "ok.")
    assert main(base + ["--grammar", "root ::= ("]) == 1
    assert "expecting" in capsys.readouterr().err


def test_bench_grammar_prints_its_table(smollm_path, capsys):
    from gguflm.cli import main

    assert main(["bench", "grammar", "-m", str(smollm_path), "-n", "8", "-r", "1", "-t", "1",
                 "-q", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    mask = report["mask"]["gguflm"]
    assert mask["n"] >= 1 and mask["masks_computed"] + mask["masks_cached"] == mask["n"]
    rates = report["generation"]["gguflm"]
    assert rates["constrained"]["tokens_per_s"] > 0 and rates["unconstrained"]["tokens_per_s"] > 0
