"""The committed checkpoints' chat template and tokenizer against transformers' own renderings and
ids (tests/data/tokenizer_cases.json, written by tools/make_test_checkpoints.py with
transformers' AutoTokenizer), so CI checks them without transformers installed."""

import json
import os

import numpy as np
import pytest

from pyengine import LLM
from pyengine.chat_template import ChatTemplate
from pyengine.tokenizer import Tokenizer

DATA = os.path.join(os.path.dirname(__file__), "data")
# text_bf16 keeps its template in tokenizer_config.json, the wrapper in chat_template.jinja.
CHECKPOINTS = ["ckpt_text_bf16", "ckpt_wrapper_bf16", "ckpt_interval_f32", "ckpt_text_fp8"]

with open(os.path.join(DATA, "tokenizer_cases.json"), encoding="utf-8") as f:
    CASES = json.load(f)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_template_renders_as_transformers_did(name):
    template = ChatTemplate.from_dir(os.path.join(DATA, name))
    messages = CASES["chat_messages"]
    assert template.render(messages) == CASES["chat_rendered"]
    assert template.render(messages, enable_thinking=False) == CASES["chat_rendered_no_thinking"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tokenizer_gives_transformers_ids(name):
    tok = Tokenizer(os.path.join(DATA, name))
    assert {t: tok.token_to_id(t) for t in CASES["special_tokens"]} == CASES["special_tokens"]
    assert len(CASES["samples"]) == 4
    for sample in CASES["samples"]:
        assert tok.encode(sample["text"]) == sample["ids"], sample["text"]
        assert tok.decode(sample["ids"], skip_special_tokens=False) == sample["text"]
    assert tok.encode(CASES["chat_rendered"]) == CASES["chat_ids"]


def test_chat_prompt_ids_through_the_llm_equal_the_goldens_prompt():
    """The path llm.chat() takes (template, then encode) gives the ids the goldens' "text"
    prompt was computed from."""
    with LLM(os.path.join(DATA, "ckpt_wrapper_bf16"), max_model_len=128) as llm:
        ids = llm.tokenizer.encode(llm.apply_chat_template(CASES["chat_messages"]))
    assert ids == CASES["chat_ids"]
    golden = np.load(os.path.join(DATA, "ckpt_wrapper_bf16", "goldens.npz"))["prompt_text_ids"]
    assert ids == golden.tolist()
