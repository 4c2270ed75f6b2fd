"""Structured outputs in process: the engine samples under llguidance's masks (CPU sampler), so
even a random-weight model writes only what the grammar allows; requests without a grammar in
the same batch are unchanged; bad grammars are errors that name the problem; reasoning is free."""
import json
import os
import re

import jsonschema
import pytest

from pyengine import LLM, SamplingParams, StructuredOutputsParams

CKPT = os.path.join(os.path.dirname(__file__), "data", "ckpt_text_bf16")
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                   "kind": {"enum": ["a", "b"]}, "ok": {"type": "boolean"}},
    "required": ["id", "kind", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm():
    with LLM(CKPT, max_batch=8, max_model_len=1024) as llm:
        yield llm


def so(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=60, temperature=1.0, **kw)


def test_random_weights_follow_a_regex_and_a_schema(llm):
    regex = StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}")
    outs = llm.generate(["x"] * 8, [so(seed=i, structured_outputs=regex) for i in range(8)])
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2}", o.text) and o.finish_reason == "stop" for o in outs)
    assert len({o.text for o in outs}) > 1
    outs = llm.generate(["y"] * 8, [so(seed=i, structured_outputs=StructuredOutputsParams(json=SCHEMA))
                                    for i in range(8)])
    for o in outs:
        assert o.finish_reason == "stop"
        jsonschema.validate(json.loads(o.text), SCHEMA)
    free = llm.generate(["y"] * 4, [so(seed=i) for i in range(4)])
    assert not any(re.fullmatch(r"[0-9]{3}-[a-z]{2}", o.text) for o in free)


def test_unconstrained_requests_in_the_same_batch_are_unchanged(llm):
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = llm.generate(["hello there", "one two three"], greedy)
    mixed = llm.generate(["hello there", "{", "one two three", "{"],
                         [greedy, so(seed=1, structured_outputs=StructuredOutputsParams(json_object=True)),
                          greedy, so(seed=2, structured_outputs=StructuredOutputsParams(json=SCHEMA))])
    assert [mixed[0].token_ids, mixed[2].token_ids] == [alone[0].token_ids, alone[1].token_ids]
    assert isinstance(json.loads(mixed[1].text), dict) or mixed[1].finish_reason == "length"


def test_grammar_starts_after_the_reasoning(llm):
    """The masks of a prompt that opens "<think>": none until the model's "</think>" (split over
    tokens here), then the grammar's (compact JSON: "{" first)."""
    assert llm.apply_chat_template([{"role": "user", "content": "data?"}]).rstrip().endswith("<think>")
    params = StructuredOutputsParams(json=SCHEMA)
    c = llm.grammars.constraint(llm.grammars.matcher(params), starts_in_reasoning=True)
    assert c.next_mask() is None
    for t in llm.tokenizer.encode("let me think </"):
        c.advance(t)
        assert c.next_mask() is None
    for t in llm.tokenizer.encode("think>"):
        c.advance(t)
    mask = c.next_mask()
    assert mask is not None
    allowed = [t for t in range(llm.config.vocab_size) if mask[t >> 5] >> (t & 31) & 1]
    assert allowed and all(llm.tokenizer.decode([t]).startswith("{") for t in allowed)


def test_bad_grammars_name_the_problem(llm):
    with pytest.raises(ValueError, match="nonsense"):
        llm.check_structured_outputs(StructuredOutputsParams(json={"type": "nonsense"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        llm.check_structured_outputs(StructuredOutputsParams(json="{oops"))
    with pytest.raises(ValueError):
        llm.generate(["x"], so(structured_outputs=StructuredOutputsParams(grammar="start: ((")))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"json": {}})


def test_token_mask_api_checks_its_arguments(llm):
    n = llm._engine._n
    words = n.ffi.new("uint32_t[]", 3)
    status = n.lib.pe_engine_set_token_mask(llm._engine.handle, 12345, 0, words, 3)
    assert status == -1 and "words" in n.ffi.string(n.lib.pe_last_error()).decode()
    assert n.lib.pe_engine_set_token_mask(llm._engine.handle, 12345, 0, n.ffi.NULL, 0) == 0  # unknown id
