"""Agent serving through the official `openai` client against a real `pyengine serve`: tool
calls (non-streamed, streamed and assembled by the client's stream helper, a round trip
through a tool message), tool_choice forced by a grammar, response_format JSON schemas, errors
that name the field, and prefill progress chunks.

Most tests use the embedded default model (a real, tiny chat model: its template lists tools
and renders calls and tool results in the Qwen3.5 format). It was never trained on tool calls,
so its calls come from tool_choice "required" (the grammar forces the format; the model picks
the values). One test uses a random-weight checkpoint, where only the grammar can produce a call.
"""
import json

import jsonschema
import openai
import pytest
from server_process import API_KEY, agent_server, api_server
from server_process import API_MODEL as TINY

from pyengine.chat_template import ChatTemplate
from pyengine.llm import default_model_path
from pyengine.tokenizer import Tokenizer

MODEL = "default_model"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
}
ASK = [{"role": "user", "content": "What will the weather be in Paris in the next 3 days?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=agent_server().url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def call_args(call) -> dict:
    return json.loads(call.function.arguments)


def assert_valid_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(call_args(call), WEATHER["function"]["parameters"])


def test_streamed_tool_calls_assemble_to_the_non_streamed_ones(client):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER, SEARCH], tool_choice="required",
              parallel_tool_calls=False, temperature=0, max_tokens=120, extra_body=NO_THINK)
    full = client.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "search")
    if call.function.name == "get_weather":
        assert_valid_weather_call(call)

    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if c.choices]
    # One delta opens the call (id, type, name), then argument fragments only.
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == call.function.name
    assert all(d.id is None and d.function.name is None for d in deltas[1:]) and len(deltas) > 1
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    # The client's own stream helper assembles the same call.
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    (assembled,) = final.choices[0].message.tool_calls
    assert (assembled.function.name, assembled.function.arguments) == \
        (call.function.name, call.function.arguments)


def test_named_tool_choice_and_parallel_calls(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[SEARCH, WEATHER],
                                       tool_choice=named, temperature=1, seed=3, max_tokens=200,
                                       extra_body=NO_THINK)
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for c in calls:
        assert_valid_weather_call(c)
    assert len({c.id for c in calls}) == len(calls)


def test_round_trip_call_tool_result_answer(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False,
                                           temperature=0, max_tokens=120, extra_body=NO_THINK)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny", "high_c": 24}'},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                            temperature=0, max_tokens=40, extra_body=NO_THINK)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    # The server rendered the call and the tool result in the model's own format.
    args = call_args(call)
    rendered = ChatTemplate.from_dir(default_model_path()).render(
        [*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.function.name, "arguments": args}}]},
         {"role": "tool", "content": messages[-1]["content"]}],
        tools=[WEATHER], add_generation_prompt=True, enable_thinking=False)
    assert f"<function=get_weather>\n<parameter=city>\n{args['city']}\n</parameter>" in rendered
    assert '<tool_response>\n{"forecast": "sunny", "high_c": 24}\n</tool_response>' in rendered
    n_prompt = len(Tokenizer(default_model_path()).encode(rendered))
    assert answer.usage.prompt_tokens == n_prompt


def test_required_tool_choice_forces_a_valid_call_from_random_weights():
    server = api_server()  # a random-weight checkpoint: its text never looks like a call
    tiny = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    for seed in range(4):
        r = tiny.chat.completions.create(model=TINY, messages=ASK, tools=[WEATHER],
                                         tool_choice="required", parallel_tool_calls=False,
                                         temperature=1, seed=seed, max_tokens=200, extra_body=NO_THINK)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        (call,) = r.choices[0].message.tool_calls
        assert_valid_weather_call(call)
    free = tiny.chat.completions.create(model=TINY, messages=ASK, tools=[WEATHER], temperature=1,
                                        seed=0, max_tokens=30, extra_body=NO_THINK)
    assert not free.choices[0].message.tool_calls  # auto: no grammar, gibberish, no call


def test_json_schema_responses_validate_for_50_seeded_samples(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    ask = [{"role": "user", "content": "Describe a user of the system as JSON."}]
    texts = []
    for seed in range(5):  # 5 requests x n = 10: 50 samples at T = 1
        r = client.chat.completions.create(model=MODEL, messages=ask, response_format=fmt, n=10,
                                           temperature=1, seed=100 + 10 * seed, max_tokens=120,
                                           extra_body=NO_THINK)
        assert [c.finish_reason for c in r.choices] == ["stop"] * 10
        texts += [c.message.content for c in r.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 10  # sampled, not one forced answer


def test_json_object_and_schema_after_reasoning(client):
    ask = [{"role": "user", "content": "What is 12 + 30? Answer in JSON."}]
    r = client.chat.completions.create(model=MODEL, messages=ask, temperature=0, max_tokens=400,
                                       response_format={"type": "json_object"})
    msg = r.choices[0].message
    assert msg.model_extra.get("reasoning_content")  # thinking on: free reasoning first
    assert isinstance(json.loads(msg.content), dict)


def test_invalid_schema_and_tool_choice_are_400s_naming_the_problem(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad)
    assert e.value.body["param"] == "response_format" and "nonsense" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice" and "'nope'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[{"type": "function"}])
    assert e.value.body["param"] == "tools"


def test_progress_chunks_for_a_4k_prompt(client):
    long = " ".join(f"item{i} costs {i % 97} coins;" for i in range(330))
    messages = [{"role": "user", "content": long + " Which item costs the most?"}]
    n_prompt = None
    progress = []
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                            stream=True, extra_body={"return_progress": True},
                                            stream_options={"include_usage": True})
    first_text_at = None
    for i, chunk in enumerate(stream):
        p = (chunk.model_extra or {}).get("prompt_progress")
        if p is not None:
            assert first_text_at is None  # progress comes before the answer
            progress.append(p)
        elif chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].delta.model_extra.get("reasoning_content")):
            first_text_at = first_text_at or i
        if chunk.usage:
            n_prompt = chunk.usage.prompt_tokens
    assert n_prompt >= 4096
    processed = [p["processed"] for p in progress]
    assert len(progress) >= -(-n_prompt // 256)  # at least one per chunk of 256
    assert processed == sorted(processed) and processed[-1] == n_prompt
    assert all(p["total"] == n_prompt and p["time_ms"] > 0 for p in progress)


def test_progress_chunks_on_completions(client):
    prompt = " ".join(f"row {i}: {i * 7 % 13}" for i in range(300))
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                       extra_body={"return_progress": True})
    progress = [c.model_extra["prompt_progress"] for c in stream if (c.model_extra or {}).get("prompt_progress")]
    assert len(progress) >= 2 and progress[-1]["processed"] == progress[-1]["total"]
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True)
    assert not any((c.model_extra or {}).get("prompt_progress") for c in plain)
