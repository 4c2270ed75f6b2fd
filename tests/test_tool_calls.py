"""Qwen3.5 tool calls without a model: the parser (whole and streamed in random pieces), value
conversion by schema, messages rendered back through a template, and the forcing grammar (every
token sequence llguidance lets through parses into a call that validates)."""
import json
import os
import random

import jsonschema
import llguidance
import numpy as np
import pytest

from pyengine.chat_template import ChatTemplate
from pyengine.llm import default_model_path
from pyengine.structured_outputs import GrammarCompiler
from pyengine.tool_calls import ToolCallParser, convert_value, messages_for_template, parse_tool_calls
from pyengine.tool_grammar import forced_tool_grammar, tool_call_grammar, tool_choice_function

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city", "days"],
}}}
TWO_CALLS = (
    "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=where>\n"
    '{"lat": 40.7}\n</parameter>\n<parameter=tags>\n["a", "b c"]\n</parameter>\n</function>\n'
    "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <France>\n"
    "</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>"
)


def test_parse_two_calls_with_converted_values():
    content, calls = parse_tool_calls(TWO_CALLS, [WEATHER])
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "New York", "days": 3, "metric": True, "where": {"lat": 40.7}, "tags": ["a", "b c"]}
    assert calls[1]["function"]["arguments"] == '{"city": "Paris <France>", "days": 1}'
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("text", [
    TWO_CALLS,
    "plain answer, no call <b>bold</b>\n",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",  # cut by max_tokens
    "<tool_call>\n<function=get_weather>\n<parameter=days>\n5\n<parameter=city>\nX\n</function>",
    "<tool_call>\n<function=noargs>\n</function>\n</tool_call>",
    "<tool_callx> not a call",
])
def test_streaming_in_random_pieces_equals_one_piece(text):
    want_content, want_calls = parse_tool_calls(text, [WEATHER])
    for seed in range(100):
        rng = random.Random(seed)
        parser = ToolCallParser([WEATHER])
        content, args, heads = "", {}, {}
        i = 0
        while i <= len(text):
            piece = text[i:i + rng.randint(1, 9)]
            i += max(len(piece), 1)
            c, deltas = parser.feed(piece) if piece else parser.finish()
            content += c
            for d in deltas:
                if d.name is not None:  # the opening delta comes first, once per call
                    assert d.index not in heads and d.index not in args
                    heads[d.index] = (d.id, d.name)
                args[d.index] = args.get(d.index, "") + d.arguments
        assert content == want_content
        assert [heads[i][1] for i in sorted(heads)] == [c["function"]["name"] for c in want_calls]
        assert [args[i] for i in sorted(args)] == [c["function"]["arguments"] for c in want_calls]


def test_max_calls_keeps_the_first():
    _, calls = parse_tool_calls(TWO_CALLS, [WEATHER], max_calls=1)
    assert len(calls) == 1 and json.loads(calls[0]["function"]["arguments"])["city"] == "New York"


@pytest.mark.parametrize("raw, schema, value", [
    ("42", {"type": "integer"}, 42),
    ("4.5", {"type": "number"}, 4.5),
    ("7", {"type": "number"}, 7),
    ("True", {"type": "boolean"}, True),
    ("null", {"type": ["string", "null"]}, None),
    ("x y", {"type": "string"}, "x y"),
    ("42", {"type": "string"}, "42"),
    ("[1, 2]", {"type": "array"}, [1, 2]),
    ("{'a': 1}", {"type": "object"}, {"a": 1}),
    ("not json", {"type": "object"}, "not json"),
    ("12", None, 12),  # unknown parameter: JSON if it is JSON
    ("hello", None, "hello"),
    ("B", {"enum": ["A", "B"]}, "B"),
])
def test_convert_value(raw, schema, value):
    assert convert_value(raw, schema) == value


def test_tool_calls_render_back_through_the_template():
    tpl = ChatTemplate.from_dir(default_model_path())
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = tpl.render(messages_for_template(messages), tools=[WEATHER], enable_thinking=False)
    assert ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>") in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert '"name": "get_weather"' in text  # the tools listed in the system turn
    # What the template renders parses back into the same call.
    body = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
    _, calls = parse_tool_calls(body.split("</think>")[-1], [WEATHER])
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}
    with pytest.raises(ValueError, match="not valid JSON"):
        messages_for_template([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{oops"}}]}])


def test_tool_choice_values():
    assert tool_choice_function("auto") is None and tool_choice_function("required") is None
    assert tool_choice_function({"type": "function", "function": {"name": "f"}}) == "f"
    with pytest.raises(ValueError):
        tool_choice_function("sometimes")
    assert forced_tool_grammar([WEATHER], "auto", True) is None
    with pytest.raises(ValueError, match="'nope'"):
        tool_call_grammar([WEATHER], "nope")


def _random_walks(checkpoint: str, vocab: int, eos: int, grammar: str, n: int, max_len: int):
    """Token sequences sampled uniformly among the tokens llguidance allows, until it stops."""
    compiler = GrammarCompiler(checkpoint, vocab, [eos], None)
    tok = compiler._tokenizer()
    grammar = llguidance.LLMatcher.grammar_from_lark(grammar)
    for seed in range(n):
        rng = random.Random(seed)
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        toks = []
        while not m.is_stopped() and len(toks) < max_len:
            mask = np.frombuffer(m.compute_bitmask(), dtype=np.uint32)
            allowed = np.flatnonzero((mask[np.arange(vocab) >> 5] >> (np.arange(vocab) & 31)) & 1)
            t = int(rng.choice(allowed))
            assert m.consume_token(t)
            toks.append(t)
        yield m.is_stopped(), tok.decode_str([t for t in toks if t != eos])


CHECKPOINTS = [(default_model_path(), 8192, 2),
               (os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16"), 512, 509)]


@pytest.mark.parametrize("checkpoint, vocab, eos", CHECKPOINTS)
def test_forced_grammar_only_lets_valid_calls_through(checkpoint, vocab, eos):
    bounded = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {
            "unit": {"type": "string", "enum": ["C", "F"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"}},
        "required": ["unit", "n"]}}}
    tools = [bounded, {"type": "function", "function": {"name": "noop"}}]
    compiler = GrammarCompiler(checkpoint, vocab, [eos], None)
    for parallel in (False, True):
        grammar = tool_call_grammar(tools, None, parallel, compiler.tag)
        finished = 0
        for stopped, text in _random_walks(checkpoint, vocab, eos, grammar, 25, 400):
            if not stopped:
                continue  # a walk of parallel calls may go on for longer than max_len
            finished += 1
            content, calls = parse_tool_calls(text, tools)
            assert content == "" and calls, text
            assert parallel or len(calls) == 1
            for c in calls:
                args = json.loads(c["function"]["arguments"])
                if c["function"]["name"] == "pick":
                    jsonschema.validate(args, bounded["function"]["parameters"])
                else:
                    assert c["function"]["name"] == "noop" and args == {}
        assert finished >= 10
