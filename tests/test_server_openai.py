"""The official `openai` client against a real `pyengine serve` (gunicorn) on loopback.

The test checkpoint has random weights: texts are gibberish, but token streams, sampling,
seeds, stops and logprobs are real, so every assertion compares the server with itself
(streaming vs not, chat vs completions of the rendered prompt, n=2 vs two seeded requests).
"""
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
from server_process import API_KEY, api_server, find_checkpoint
from server_process import API_MODEL as MODEL

from pyengine.chat_template import ChatTemplate
from pyengine.reasoning import split_reasoning

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server():
    return api_server()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


EXTENSIONS = ("ignore_eos", "skip_special_tokens", "stop_token_ids", "top_k", "min_p",
              "repetition_penalty")


def complete(client, prompt, **kw):
    """client.completions.create with temperature 0 by default and the non-OpenAI fields
    (ignore_eos, top_k, ...) moved into extra_body."""
    kw.setdefault("temperature", 0)
    extra = {**kw.pop("extra_body", {}), **{k: kw.pop(k) for k in EXTENSIONS if k in kw}}
    return client.completions.create(model=MODEL, prompt=prompt, extra_body=extra, **kw)


def test_models_lists_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == 512
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_streaming_equals_non_streaming_with_usage(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16,
                                          temperature=0, extra_body=NO_THINK)
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.model_extra.get("reasoning_content") is None  # thinking off
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    assert 0 < full.usage.completion_tokens <= 16
    assert choice.finish_reason in ("stop", "length")

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=NO_THINK))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_is_template_plus_completion_with_reasoning_split(client):
    # The test template opens "<think>\n" in the prompt when thinking is on (the default), so
    # the output starts inside the reasoning.
    prompt = ChatTemplate.from_dir(find_checkpoint()).render(CHAT, add_generation_prompt=True)
    assert prompt.rstrip().endswith("<think>")
    raw = complete(client, prompt, max_tokens=40, ignore_eos=True, skip_special_tokens=False)
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False})
    reasoning, content = split_reasoning(raw.choices[0].text, starts_in_reasoning=True)
    message = chat.choices[0].message
    assert message.model_extra["reasoning_content"] == reasoning
    assert message.content == content
    assert chat.usage.prompt_tokens == raw.usage.prompt_tokens
    streamed = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "skip_special_tokens": False})
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content


def test_completions_streaming_equals_non_streaming(client):
    full = complete(client, "The quick brown fox", max_tokens=20, ignore_eos=True)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 20
    chunks = list(complete(client, "The quick brown fox", max_tokens=20, ignore_eos=True,
                           stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 20


def test_chat_logprobs_with_top_alternatives(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 8
    for e in entries:
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and tops[0] <= 0.0
        assert e.token == e.top_logprobs[0].token  # greedy takes the most likely token
        assert e.logprob == pytest.approx(tops[0], abs=1e-4)
        assert e.bytes == list(e.token.encode())
    streamed = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
        stream=True, extra_body={"ignore_eos": True})
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
    assert tokens == [e.token for e in entries]


def test_completion_logprobs_legacy_format(client):
    r = complete(client, "Hello", max_tokens=6, logprobs=2, ignore_eos=True)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]


def test_stop_string_across_a_token_boundary(client):
    base = complete(client, "One, two, three", max_tokens=40, logprobs=0, ignore_eos=True)
    tokens, text = base.choices[0].logprobs.tokens, base.choices[0].text
    # A stop string made of the end of one token and the start of the next.
    offset = 0
    for k in range(3, len(tokens) - 1):
        offset = sum(len(t) for t in tokens[:k + 1])
        left, right = tokens[k], tokens[k + 1]
        if left.strip() and right.strip() and "\ufffd" not in left + right:
            stop = left[-1] + right[:2]
            break
    else:
        pytest.skip("no printable token pair in this output")
    expected = text[:text.index(stop)]
    assert text.index(stop) < offset  # it ends inside the generated text
    r = complete(client, "One, two, three", max_tokens=40, stop=[stop, "never-seen-stop"],
                 ignore_eos=True)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (expected, "stop")
    streamed = complete(client, "One, two, three", max_tokens=40, stop=stop, ignore_eos=True,
                        stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_text_held_for_a_stop_string_is_sent_when_generation_ends_by_length(client):
    # A stop string that begins with the output's last characters holds them back to the end.
    base = complete(client, "One, two, three", max_tokens=16, ignore_eos=True).choices[0]
    text = base.text
    assert base.finish_reason == "length" and len(text) >= 4 and "\u2603" not in text
    kw = {"max_tokens": 16, "ignore_eos": True, "stop": [text[-3:] + "\u2603"]}
    r = complete(client, "One, two, three", **kw).choices[0]
    assert (r.text, r.finish_reason) == (text, "length")
    chunks = [c.choices[0] for c in complete(client, "One, two, three", stream=True, **kw) if c.choices]
    assert "".join(c.text for c in chunks) == text
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["length"]


def test_n2_choices_match_seeded_single_requests(client):
    kw = {"max_tokens": 12, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    both = complete(client, "Once upon a time", n=2, **kw)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.completion_tokens == 24
    first = complete(client, "Once upon a time", **kw).choices[0].text
    second = complete(client, "Once upon a time", **{**kw, "seed": 8}).choices[0].text
    assert [c.text for c in both.choices] == [first, second]
    assert first != second
    streamed = complete(client, "Once upon a time", n=2, stream=True, **kw)
    texts, finished = ["", ""], {}
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert texts == [first, second]
    assert finished == {0: "length", 1: "length"}


def test_chat_n2_streaming(client):
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, max_tokens=6,
                                            temperature=0.8, seed=3, stream=True,
                                            extra_body={"ignore_eos": True, **NO_THINK})
    finished = {c.index: c.finish_reason for chunk in stream for c in chunk.choices
                if c.finish_reason}
    assert finished == {0: "length", 1: "length"}


def test_seed_reproducible_at_temperature_above_zero(client):
    kw = {"messages": CHAT, "max_tokens": 24, "temperature": 0.9, "top_p": 0.95,
              "extra_body": {"ignore_eos": True, **NO_THINK}}
    a = client.chat.completions.create(model=MODEL, seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(model=MODEL, seed=1234, **kw).choices[0].message.content
    c = client.chat.completions.create(model=MODEL, seed=4321, **kw).choices[0].message.content
    assert a == b
    assert a != c


def test_sampling_extensions_are_honoured(client):
    as_ids = {"return_tokens_as_token_ids": True}
    base = complete(client, "def add(a, b):", max_tokens=10, logprobs=0, ignore_eos=True,
                    extra_body=as_ids)
    assert base.choices[0].finish_reason == "length"
    ids = [int(t.removeprefix("token_id:")) for t in base.choices[0].logprobs.tokens]
    assert len(ids) == 10
    # Stop on the id of the 5th generated token: the output ends where that id first appears
    # (stop_token_ids are not part of the output, as EOS).
    r = complete(client, "def add(a, b):", max_tokens=10, logprobs=0, stop_token_ids=[ids[4]],
                 extra_body=as_ids)
    assert r.choices[0].finish_reason == "stop"
    got = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
    assert got in (ids[:ids.index(ids[4])], ids[:ids.index(ids[4]) + 1])
    r = complete(client, "def add(a, b):", max_tokens=10, temperature=0.7, top_p=0.9,
                 presence_penalty=0.5, frequency_penalty=0.5, seed=1, top_k=20, min_p=0.05,
                 repetition_penalty=1.2, ignore_eos=True)
    assert r.usage.completion_tokens == 10


def test_more_concurrent_requests_than_max_batch(client, server):
    def one(i):
        kw = {"max_tokens": 16, "temperature": 0.5, "seed": i, "ignore_eos": True}
        if i % 2:
            return complete(client, f"Request number {i}", **kw).usage.completion_tokens
        chunks = list(complete(client, f"Request number {i}", stream=True,
                               stream_options={"include_usage": True}, **kw))
        return chunks[-1].usage.completion_tokens

    with ThreadPoolExecutor(10) as pool:  # max_batch is 4: some requests wait their turn
        assert list(pool.map(one, range(10))) == [16] * 10
    assert server.wait_idle()["running"] == 0


def test_service_endpoints(server, client):
    assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok"}
    cap = server.get("/v1/capacity").json()
    assert cap["max_model_len"] == 512
    for key in ("kv_page_size", "kv_pages", "context_tokens_per_session", "gdn_slots"):
        assert key in cap["plan"]
    assert cap["pools"]["kv_pages_total"] > 0
    text = requests.get(server.url + "/metrics", timeout=5).text
    values = {line.split(" ")[0]: float(line.split(" ")[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values["pyengine_prompt_tokens_total"] > 0
    assert values["pyengine_generation_tokens_total"] > 0
    assert values["pyengine_time_to_first_token_seconds_count"] > 0
    assert values["pyengine_inter_token_latency_seconds_count"] > 0
    assert values["pyengine_requests_running"] == 0
    assert values["pyengine_kv_pages_total"] == cap["pools"]["kv_pages_total"]
    assert "pyengine_gdn_slots_free" in values and "pyengine_prefix_cache_hit_tokens_total" in values
    assert values['pyengine_request_finished_total{finish_reason="length"}'] > 0
    assert values['pyengine_http_requests_total{route="/v1/completions",status="200"}'] > 0
