"""gguflm.ray.serve on a local Ray (2 CPUs, loopback): two replicas of SmolLM2 and one of
all-MiniLM behind one OpenAI ingress, driven by the ``openai`` client. Greedy replies equal the
single-process server's (``create_app``); streams pass through; a continued conversation reaches
the replica holding its cache; killing a replica mid-stream fails only its stream; an autoscaled
deployment goes from 1 replica to 2 under load and back."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason='the ray extra: pip install "gguflm[ray]"')
openai = pytest.importorskip("openai")
from ray import serve  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gguflm import LLM  # noqa: E402
from gguflm.ray.serve import REPLICA_HEADER, LLMConfig, build_openai_app, rank_replicas, session_key  # noqa: E402
from gguflm.server import create_app  # noqa: E402

MINILM = Path(__file__).resolve().parent / "data" / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
TINY = Path(__file__).resolve().parent / "data" / "arch" / "llama.gguf"
ENGINE = {"parallel": 2, "n_ctx": 2048, "n_threads": 1}
KEY = "test-key"      # the first app's replicas check it (the server's own API key check)
# a replica reserves num_cpus = n_threads (1 here); the tests' replicas reserve half of that so
# that both apps fit the 2 CPUs of this local Ray
HALF_CPU = {"ray_actor_options": {"num_cpus": 0.5}}
APP, SCALED = "gguflm-test", "gguflm-scaled"
QUESTIONS = ["What is a river?", "Name a colour.", "Why is the sky blue?", "Say hello."]
SYSTEM = ("You are a patient tutor. " + "Answer in one short sentence, plainly, without lists. " * 40).strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray's processes read these when they start: the replicas and handles report their ongoing
# requests every half second (10 s by default), so that the autoscaling test takes seconds; the
# HTTP proxy gets 60 s rather than 5 to start on a loaded 2-core machine (after three slow
# readiness checks Serve kills it and serve.start fails)
RAY_ENV = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
           "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}


@pytest.fixture(scope="module")
def base_url():
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for k, v in saved.items():
        if v is None:
            del os.environ[k]
        else:
            os.environ[k] = v
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    """Two LoRA adapters of the tiny llama model (tests/lora_files.py)."""
    from lora_files import write_lora

    out, rng = tmp_path_factory.mktemp("ray-lora"), np.random.default_rng(11)
    return [write_lora(out / "a.gguf", TINY, rng, rank=16, strength=4.0),
            write_lora(out / "b.gguf", TINY, rng, rank=32, strength=4.0, kinds=("attn_q", "ffn_up"))]


@pytest.fixture(scope="module")
def client(base_url, smollm_path, adapters):
    configs = [LLMConfig({"model_id": "smol", "model_source": str(smollm_path)}, {**ENGINE, "api_key": KEY},
                         {"num_replicas": 2, **HALF_CPU}),
               LLMConfig({"model_id": "minilm", "model_source": str(MINILM)},
                         {"embedding": True, "parallel": 1, "n_ctx": 512, "n_threads": 1, "api_key": KEY},
                         {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}),
               LLMConfig({"model_id": "tiny-lora", "model_source": str(TINY)},
                         {"parallel": 2, "n_ctx": 512, "n_threads": 1, "api_key": KEY,
                          "lora_adapters": {str(adapters[0]): 1.0, str(adapters[1]): 0.5}},
                         {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}})]
    serve.run(build_openai_app({"llm_configs": configs}), name=APP, route_prefix="/")
    yield openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(smollm_path):
    """``gguflm serve``'s app in this process, with the replicas' settings."""
    with TestClient(create_app(smollm_path, alias="smol", **ENGINE)) as test_client:
        yield test_client


def replicas(app: str = APP, deployment: str = "gguflm-smol") -> dict[str, str]:
    """The running replicas' actor names by unique id."""
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return {a["name"][len(prefix):]: a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)}


def key_for(uid: str) -> str:
    """A session key the router sends to replica ``uid``."""
    ids = list(replicas())
    return next(k for k in (f"s{i}" for i in range(1000)) if rank_replicas("session:" + k, ids)[0] == uid)


def chat(client, messages, key=None, **kwargs):
    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=messages, temperature=0, max_tokens=16,
        extra_headers={"X-Session-Id": key} if key else None, **kwargs)
    return raw.headers[REPLICA_HEADER], raw.parse()


def reference_chat(reference, messages, max_tokens=16):
    r = reference.post("/v1/chat/completions", json={"model": "smol", "messages": messages,
                                                     "temperature": 0, "max_tokens": max_tokens})
    return r.json()["choices"][0]["message"]["content"]


def test_replica_cpus_are_its_threads(smollm_path):
    config = LLMConfig({"model_source": str(smollm_path)}, {"n_threads": 3, "parallel": 2},
                       {"autoscaling_config": {"max_replicas": 4}})
    options = config.deployment_options()
    assert config.model_id == "SmolLM2-135M-Instruct.Q4_1"
    assert options["ray_actor_options"]["num_cpus"] == 3
    assert options["autoscaling_config"] == {"target_ongoing_requests": 2, "max_replicas": 4}
    assert options["request_router_config"]["request_router_class"].endswith("SessionAffinityRouter")
    # a conversation's key is its start: the later turns share it
    first = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    later = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert session_key({"messages": first}, {}) == session_key({"messages": later}, {})
    assert session_key({"messages": first}, {"x-session-id": "a"}) == "session:a"
    assert session_key({"input": "text"}, {}) is None


def test_the_config_file_of_the_docs_builds_the_app():
    import yaml
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary as serve_builds
    from ray.serve.schema import ServeDeploySchema

    docs = (Path(__file__).resolve().parent.parent / "docs" / "scale-out.md").read_text()
    config = ServeDeploySchema.model_validate(yaml.safe_load(re.search(r"```yaml\n(.*?)```", docs, re.S)[1]))
    app = config.applications[0]
    assert app.import_path == "gguflm.ray.serve:build_openai_app"
    built = serve_builds(build_openai_app, app.args)        # what `serve run` does with it
    assert type(built).__name__ == "Application"


def test_the_command_line(base_url, smollm_path, monkeypatch, capsys):
    import gguflm.ray.serve as ray_serve
    from gguflm.cli import main

    built = []
    monkeypatch.setattr(ray_serve, "build_openai_app", built.append)
    for name in ("start", "run", "shutdown"):          # the app is only built here
        monkeypatch.setattr(serve, name, lambda *args, **kwargs: None)
    assert main(["serve", "--ray", "-m", str(smollm_path), "-m", str(MINILM), "--replicas", "2",
                 "--max-replicas", "3", "-t", "2", "-np", "3", "-c", "1024"]) == 0
    configs = built[0]["llm_configs"]
    assert [c.model_id for c in configs] == ["SmolLM2-135M-Instruct.Q4_1", "all-MiniLM-L6-v2-Q8_0"]
    options = configs[0].deployment_options()
    assert options["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 3, "target_ongoing_requests": 3}
    assert options["ray_actor_options"] == {"num_cpus": 2}
    assert configs[0].engine_kwargs["n_ctx"] == 1024 and configs[0].engine_kwargs["parallel"] == 3
    assert main(["serve", "--ray", "-m", str(smollm_path), "--replicas", "2", "--max-replicas", "1"]) == 1
    assert "need 1 <= N <= M" in capsys.readouterr().err


def test_a_model_a_node_cannot_read_fails_the_deployment_clearly(base_url, tmp_path):
    config = LLMConfig({"model_id": "gone", "model_source": str(tmp_path / "gone.gguf")}, ENGINE,
                       {"num_replicas": 1, "max_constructor_retry_count": 1, **HALF_CPU})
    try:
        with pytest.raises(RuntimeError, match="gguflm-gone"):
            serve.run(build_openai_app({"llm_configs": [config]}), name="gguflm-broken", route_prefix="/broken")
        # `serve status` says why
        message = serve.status().applications["gguflm-broken"].deployments["gguflm-gone"].message
        assert re.search(r"ModelSourceError: model .*gone.gguf: no readable file .* on node", message)
    finally:
        serve.delete("gguflm-broken")


def test_two_replicas_answer_as_one_server(client, reference):
    uids = list(replicas())
    assert len(uids) == 2
    jobs = [([{"role": "user", "content": q}], key_for(uids[i % 2])) for i, q in enumerate(QUESTIONS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: chat(client, *job), jobs))
    assert {replica for replica, _ in answers} == set(replicas().values())    # both served
    for (messages, _), (_, reply) in zip(jobs, answers):
        assert reply.choices[0].message.content == reference_chat(reference, messages)


def test_streams_completions_embeddings_and_models(client, reference):
    messages = [{"role": "user", "content": QUESTIONS[2]}]
    stream = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                            max_tokens=16, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == reference_chat(reference, messages)
    completion = client.completions.create(model="smol", prompt="The river", temperature=0, max_tokens=8)
    want = reference.post("/v1/completions", json={"prompt": "The river", "temperature": 0, "max_tokens": 8})
    assert completion.choices[0].text == want.json()["choices"][0]["text"]
    # a JSON schema (a grammar) through the ingress, as the server answers it
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 10}}, "required": ["colour"]}
    fields = {"messages": [{"role": "user", "content": QUESTIONS[1]}], "temperature": 0, "max_tokens": 24,
              "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    constrained = client.chat.completions.create(model="smol", **fields).choices[0].message.content
    assert constrained == reference.post("/v1/chat/completions", json=fields).json()["choices"][0]["message"]["content"]
    assert constrained.startswith("{")
    vector = client.embeddings.create(model="minilm", input="a quiet river").data[0].embedding
    assert vector == LLM(MINILM, embedding=True, n_threads=1, progress=False).embed("a quiet river")
    assert sorted(m.id for m in client.models.list()) == ["minilm", "smol", "tiny-lora"]   # every deployment's entries
    stranger = client.with_options(api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with pytest.raises(openai.AuthenticationError):
        stranger.completions.create(model="smol", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError, match="model_not_found|not found"):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def ttft(client, messages, key=None) -> tuple[str, float]:
    """The replica and the seconds to the first streamed token."""
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=messages, temperature=0, max_tokens=4, stream=True,
        extra_headers={"X-Session-Id": key} if key else None)
    first = None
    for chunk in raw.parse():
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    return raw.headers[REPLICA_HEADER], first


def test_lora_adapters_by_request(client, adapters):
    """A request's ``lora`` scales (llama-server's field) reach the replica's engine: each set of
    scales gives the greedy text of an LLM holding those adapters at those scales alone."""
    greedy = {"temperature": 0, "max_tokens": 12}
    for scales in ([1.0, 0.0], [0.0, 0.7], [0.0, 0.0]):
        with LLM(TINY, n_ctx=256, n_threads=1, type_k="f32", type_v="f32", progress=False,
                 lora_adapters={str(p): s for p, s in zip(adapters, scales) if s}) as llm:
            want = llm.create_completion("p1 p2 p3 p4", repeat_penalty=1.0, **greedy)["choices"][0]["text"]
        got = client.completions.create(model="tiny-lora", prompt="p1 p2 p3 p4", **greedy,
                                        extra_body={"repeat_penalty": 1.0,
                                                    "lora": [{"id": k, "scale": s} for k, s in enumerate(scales)]})
        assert got.choices[0].text == want, scales


def test_a_continued_conversation_goes_to_its_replica(client):
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    home, reply = chat(client, turn)
    later = turn + [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": "And a lake?"}]
    warm_replica, warm = ttft(client, later)
    assert warm_replica == home               # the replica holding the conversation's cache
    other = next(uid for uid, name in replicas().items() if name != home)
    cold_replica, cold = ttft(client, later, key=key_for(other))
    assert cold_replica != home
    print(f"\nsession affinity: time to first token {warm * 1e3:.0f} ms on the conversation's replica, "
          f"{cold * 1e3:.0f} ms on a cold one ({warm / cold:.0%})")


def test_a_client_going_away_frees_its_slot(base_url, client):
    import http.client
    import json

    uid, name = next(iter(replicas().items()))
    headers = {"X-Session-Id": key_for(uid), "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    host, port = base_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 1000, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.getheader(REPLICA_HEADER) == name
    response.readline()

    def busy() -> bool:
        slots = http.client.HTTPConnection(host, int(port), timeout=30)
        slots.request("GET", "/slots?model=smol", headers=headers)
        answer = slots.getresponse()
        assert answer.getheader(REPLICA_HEADER) == name
        states = json.loads(answer.read())
        slots.close()
        return any(s["is_processing"] for s in states)

    assert busy()
    connection.close()
    # the proxy cancels the ingress's request, the ingress the replica's: its slot is freed long
    # before 1000 tokens (~25 s here) are generated
    deadline = time.monotonic() + 8
    while busy() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not busy()


def test_killing_a_replica_fails_only_its_stream(client, reference):
    victim, survivor = list(replicas().items())
    messages = [{"role": "user", "content": "Tell me a long story about a river."}]
    streams = {}
    for uid, name in (victim, survivor):
        raw = client.chat.completions.with_raw_response.create(
            model="smol", messages=messages, temperature=0, max_tokens=120, stream=True,
            extra_headers={"X-Session-Id": key_for(uid)})
        assert raw.headers[REPLICA_HEADER] == name
        streams[uid] = iter(raw.parse())
        next(streams[uid])
    ray.kill(ray.get_actor(victim[1], namespace="serve"), no_restart=True)
    with pytest.raises(openai.APIError, match="replica serving this request failed"):
        for _ in streams[victim[0]]:
            pass
    text = "".join(c.choices[0].delta.content or "" for c in streams[survivor[0]] if c.choices)
    assert len(text) > 0
    assert text == reference_chat(reference, messages, max_tokens=120)[-len(text):]
    # nothing else lost: the next requests are answered (by the survivor until a new replica is up)
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda q: chat(client, [{"role": "user", "content": q}]), QUESTIONS[:2]))
    for q, (_, reply) in zip(QUESTIONS, answers):
        assert reply.choices[0].message.content == reference_chat(reference, [{"role": "user", "content": q}])


def test_autoscaling_from_one_replica_to_two_and_back(base_url, client, smollm_path):
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0.5,
               "downscale_delay_s": 2, "look_back_period_s": 2}
    config = LLMConfig({"model_id": "smol", "model_source": str(smollm_path)}, ENGINE,
                       {"autoscaling_config": scaling, **HALF_CPU})
    serve.run(build_openai_app({"llm_configs": [config]}), name=SCALED, route_prefix="/scaled")
    scaled = openai.OpenAI(base_url=f"{base_url}/scaled/v1", api_key="none", max_retries=0, timeout=120)

    def running() -> int:
        return len(replicas(SCALED))

    assert running() == 1
    stop = threading.Event()

    def load(i: int) -> None:
        while not stop.is_set():
            scaled.completions.create(model="smol", prompt=f"Story {i}:", max_tokens=24, temperature=0)

    try:
        with ThreadPoolExecutor(4) as pool:
            loads = [pool.submit(load, i) for i in range(4)]
            deadline = time.monotonic() + 60
            while running() < 2 and time.monotonic() < deadline and not any(f.done() for f in loads):
                time.sleep(0.5)
            peak = running()
            stop.set()
    finally:
        stop.set()
    for f in loads:
        f.result()          # every request was answered
    assert peak == 2
    deadline = time.monotonic() + 60
    while running() > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running() == 1
    serve.delete(SCALED)
