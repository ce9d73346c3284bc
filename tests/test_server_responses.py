"""OpenAI's Responses API and Anthropic's Messages API on `gguflm serve`, driven by the official
`openai` and `anthropic` clients.

Both are shims over the chat completion machinery, so a greedy reply through either equals
`/v1/chat/completions`'s for the same conversation (system text, turns, tool calls and their
results), streamed or not; forced tool calls come back as each API's call item or block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pydantic = pytest.importorskip("pydantic")

from gguflm.server import create_app  # noqa: E402
from test_server import KEY, THREADS, Served  # noqa: E402

SYSTEM = "You are a terse geography assistant."
QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0, "max_tokens": 20}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                                "parameters": SCHEMA}}]
FORCE = {"type": "function", "function": {"name": "weather"}}


@pytest.fixture(scope="module")
def served(smollm_path) -> Iterator[Served]:
    s = Served(create_app(smollm_path, parallel=2, n_ctx=2048, api_key=KEY, n_threads=THREADS))
    yield s
    s.close()


def claude(served: Served, key: str = KEY):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{served.port}", api_key=key, max_retries=0,
                               timeout=120)


def chat(served: Served, messages: list[dict], **kw) -> dict:
    reply = served.client().chat.completions.create(model="m", messages=messages, **{**GREEDY, **kw})
    return reply.choices[0], reply.usage


def conversation() -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


# -- OpenAI Responses

def test_responses_greedy_equals_chat_streamed_or_not(served):
    client = served.client()
    choice, usage = chat(served, conversation())
    reply = client.responses.create(model="m", instructions=SYSTEM, input=QUESTION, temperature=0,
                                    max_output_tokens=20)
    assert reply.output_text == choice.message.content
    assert reply.status == ("incomplete" if choice.finish_reason == "length" else "completed")
    assert reply.usage.input_tokens == usage.prompt_tokens
    assert reply.usage.output_tokens == usage.completion_tokens
    assert (reply.instructions, reply.max_output_tokens, reply.text.format.type) == (SYSTEM, 20, "text")
    # the same conversation as input items
    items = client.responses.create(model="m", input=[
        {"role": "developer", "content": SYSTEM},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
        temperature=0, max_output_tokens=20)
    assert items.output_text == choice.message.content

    events = list(client.responses.create(model="m", instructions=SYSTEM, input=QUESTION, temperature=0,
                                          max_output_tokens=20, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", kinds[-1]]
    assert kinds[-1] == "response.completed" or events[-1].response.status == "incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == choice.message.content == events[-1].response.output_text
    with client.responses.stream(model="m", instructions=SYSTEM, input=QUESTION, temperature=0,
                                 max_output_tokens=20) as stream:
        final = stream.get_final_response()
    assert final.output_text == choice.message.content


def test_input_tokens_counts(served):
    _, usage = chat(served, conversation(), max_tokens=1)
    count = served.client().responses.input_tokens.count(model="m", instructions=SYSTEM, input=QUESTION)
    assert (count.object, count.input_tokens) == ("response.input_tokens", usage.prompt_tokens)
    status, body = served.json("POST", "/v1/chat/completions/input_tokens", {"messages": conversation()})
    assert (status, body) == (200, {"object": "response.input_tokens", "input_tokens": usage.prompt_tokens})


def test_responses_json_schema_format(served):
    class City(pydantic.BaseModel):
        city: str

    choice, _ = chat(served, [{"role": "user", "content": QUESTION}], max_tokens=40,
                     response_format={"type": "json_schema", "json_schema": {"name": "City", "schema": SCHEMA}})
    parsed = served.client().responses.parse(model="m", input=QUESTION, text_format=City, temperature=0,
                                             max_output_tokens=40)
    assert parsed.output_parsed == City.model_validate_json(choice.message.content)


def test_responses_function_call_output_and_previous_response(served):
    client = served.client()
    user = [{"role": "user", "content": QUESTION}]
    choice, _ = chat(served, user, max_tokens=40, tools=CHAT_TOOLS, tool_choice=FORCE)
    expected_args = choice.message.tool_calls[0].function.arguments
    tools = [{"type": "function", "name": "weather", "description": "Weather of a city",
              "parameters": SCHEMA}]
    call = client.responses.create(model="m", input=QUESTION, tools=tools, temperature=0,
                                   max_output_tokens=40, tool_choice={"type": "function", "name": "weather"})
    item = call.output[0]
    assert (item.type, item.name, item.arguments) == ("function_call", "weather", expected_args)

    streamed = list(client.responses.create(model="m", input=QUESTION, tools=tools, temperature=0,
                                            max_output_tokens=40, stream=True, tool_choice="required"))
    assert "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta") \
        == expected_args
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert done[0].arguments == expected_args

    # the tool's output continues the stored conversation, as the chat with the whole history
    follow = client.responses.create(model="m", previous_response_id=call.id, tools=tools, temperature=0,
                                     max_output_tokens=20, input=[
                                         {"type": "function_call_output", "call_id": item.call_id,
                                          "output": "Sunny, 21 C"}])
    history = user + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": item.call_id, "type": "function", "function": {"name": "weather", "arguments": expected_args}}]},
        {"role": "tool", "tool_call_id": item.call_id, "content": "Sunny, 21 C"}]
    choice, _ = chat(served, history, tools=CHAT_TOOLS)
    assert follow.output_text == choice.message.content
    # the same history given as items instead of previous_response_id
    again = client.responses.create(model="m", tools=tools, temperature=0, max_output_tokens=20, input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": item.call_id, "name": "weather", "arguments": expected_args},
        {"type": "function_call_output", "call_id": item.call_id, "output": "Sunny, 21 C"}])
    assert again.output_text == follow.output_text
    assert client.responses.retrieve(follow.id).output_text == follow.output_text

    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", previous_response_id="resp_missing", input="Hi")


@pytest.mark.parametrize("body,param", [
    ({}, "input"), ({"input": 5}, "input"), ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"type": "image"}]}, "input[0]"), ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text.format")])
def test_responses_bad_requests(served, body, param):
    status, error = served.json("POST", "/v1/responses", body)
    assert status == 400 and error["error"]["param"] == param


# -- Anthropic Messages

def test_messages_greedy_equals_chat_streamed_or_not(served):
    client = claude(served)
    choice, usage = chat(served, conversation())
    reply = client.messages.create(model="m", system=SYSTEM, max_tokens=20, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": QUESTION}])
    assert reply.content[0].text == choice.message.content
    assert reply.stop_reason == ("max_tokens" if choice.finish_reason == "length" else "end_turn")
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == usage.prompt_tokens
    assert reply.usage.output_tokens == usage.completion_tokens
    with client.messages.stream(model="m", system=[{"type": "text", "text": SYSTEM}], max_tokens=20,
                                extra_body={"temperature": 0}, messages=[{"role": "user", "content": QUESTION}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == choice.message.content
    assert final.stop_reason == reply.stop_reason and final.usage.output_tokens == usage.completion_tokens


def test_messages_count_tokens(served):
    _, usage = chat(served, conversation(), max_tokens=1)
    count = claude(served).messages.count_tokens(model="m", system=SYSTEM,
                                                 messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == usage.prompt_tokens


def test_messages_stop_sequences(served):
    choice, _ = chat(served, conversation())
    words = choice.message.content.split()
    stop = words[len(words) // 2]
    expected, _ = chat(served, conversation(), stop=[stop, "zzqx"])
    reply = claude(served).messages.create(model="m", system=SYSTEM, max_tokens=20,
                                           extra_body={"temperature": 0}, stop_sequences=["zzqx", stop],
                                           messages=[{"role": "user", "content": QUESTION}])
    assert reply.content[0].text == expected.message.content
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)


def test_messages_tool_use_and_tool_result(served):
    client = claude(served)
    user = [{"role": "user", "content": QUESTION}]
    choice, _ = chat(served, user, max_tokens=40, tools=CHAT_TOOLS, tool_choice=FORCE)
    expected = json.loads(choice.message.tool_calls[0].function.arguments)
    tools = [{"name": "weather", "description": "Weather of a city", "input_schema": SCHEMA}]
    reply = client.messages.create(model="m", max_tokens=40, extra_body={"temperature": 0}, messages=user, tools=tools,
                                   tool_choice={"type": "tool", "name": "weather"})
    block = reply.content[0]
    assert (block.type, block.name, block.input, reply.stop_reason) == ("tool_use", "weather", expected,
                                                                        "tool_use")
    with client.messages.stream(model="m", max_tokens=40, extra_body={"temperature": 0}, messages=user, tools=tools,
                                tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert final.content[0].input == expected and final.stop_reason == "tool_use"

    arguments = json.dumps(expected)
    follow = client.messages.create(model="m", max_tokens=20, extra_body={"temperature": 0}, tools=tools, messages=user + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": block.id, "name": "weather",
                                           "input": expected}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                      "content": "Sunny, 21 C"}]}])
    history = user + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": block.id, "type": "function", "function": {"name": "weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": block.id, "content": "Sunny, 21 C"}]
    choice, _ = chat(served, history, tools=CHAT_TOOLS)
    assert follow.content[0].text == choice.message.content


def test_messages_errors_in_anthropic_shape(served):
    with pytest.raises(anthropic.AuthenticationError):
        claude(served, key="wrong").messages.create(model="m", max_tokens=5,
                                                    messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude(served).messages.create(model="m", max_tokens=5, messages=[{"role": "robot", "content": "Hi"}])
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    status, error = served.json("POST", "/v1/messages", {"max_tokens": 5})
    assert status == 400 and "messages" in error["error"]["message"]
