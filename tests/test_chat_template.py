import json

import pytest

from pyengine.chat_template import ChatTemplate, ChatTemplateError, load_chat_template_source

# The parts of Qwen3.5's template that matter here: turns, tools through tojson, a thinking
# switch, raise_exception, trim/lstrip-sensitive whitespace.
QWEN_LIKE_TEMPLATE = """\
{%- if tools %}
<|im_start|>system
# Tools
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
<think>
{% if enable_thinking is defined and enable_thinking is false %}

</think>

{% endif %}
{%- endif %}"""

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]


def test_turns_and_generation_prompt():
    template = ChatTemplate(QWEN_LIKE_TEMPLATE)
    prompt = template.render(MESSAGES)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert template.render(MESSAGES, add_generation_prompt=False).endswith("1+1?<|im_end|>\n")


def test_enable_thinking_false_passes_through():
    prompt = ChatTemplate(QWEN_LIKE_TEMPLATE).render(MESSAGES, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_tojson_is_not_html_escaped_and_keeps_unicode():
    tool = {"type": "function", "function": {"name": "f", "description": "a < b & 中文"}}
    prompt = ChatTemplate(QWEN_LIKE_TEMPLATE).render(MESSAGES, tools=[tool])
    assert json.dumps(tool, ensure_ascii=False) in prompt


def test_tojson_options_match_transformers():
    template = ChatTemplate("{{ x | tojson(indent=2, sort_keys=true) }}")
    assert template.render([], x={"b": 1, "a": [1]}) == json.dumps(
        {"b": 1, "a": [1]}, indent=2, sort_keys=True
    )


def test_special_tokens_and_extra_kwargs_are_variables():
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ reasoning_effort | default('low') }}",
        {"bos_token": "<s>", "eos_token": "</s>"},
    )
    assert template.render([]) == "<s>|</s>|low"
    assert (
        template.render([], reasoning_effort="high", eos_token="<|im_end|>")
        == "<s>|<|im_end|>|high"
    )


def test_raise_exception_becomes_chat_template_error_with_its_message():
    with pytest.raises(ChatTemplateError, match="Unexpected message role: robot"):
        ChatTemplate(QWEN_LIKE_TEMPLATE).render([{"role": "robot", "content": "x"}])


def test_runtime_failure_names_the_cause():
    with pytest.raises(ChatTemplateError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 // 0 }}").render([])


def test_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match=r"does not compile: .*\(line 2\)"):
        ChatTemplate("ok\n{% if %}")


def test_sandbox_blocks_mutation_and_internals():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.append(1) }}").render(MESSAGES)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


def test_generation_tag_and_loop_controls_are_accepted():
    template = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    )
    assert template.render(MESSAGES) == "[Be brief.]"


def test_strftime_now_is_available():
    assert len(ChatTemplate("{{ strftime_now('%Y') }}").render([])) == 4


def test_matches_transformers_rendering():
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    tool = {"type": "function", "function": {"name": "f", "description": "a < b"}}
    for kwargs in ({}, {"enable_thinking": False}):
        rendered, _ = chat_template_utils.render_jinja_template(
            [MESSAGES],
            tools=[tool],
            chat_template=QWEN_LIKE_TEMPLATE,
            add_generation_prompt=True,
            **kwargs,
        )
        assert (
            ChatTemplate(QWEN_LIKE_TEMPLATE).render(MESSAGES, tools=[tool], **kwargs) == rendered[0]
        )


def test_load_from_tokenizer_config_string_and_list(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "A", "eos_token": {"content": "<e>"}}))
    assert load_chat_template_source(tmp_path) == "A"
    template = ChatTemplate.from_dir(tmp_path)
    assert template.special_tokens == {"eos_token": "<e>"}
    config.write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "T"},
                    {"name": "default", "template": "D"},
                ]
            }
        )
    )
    assert load_chat_template_source(tmp_path) == "D"
    config.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        load_chat_template_source(tmp_path)


def test_load_from_jinja_file_and_missing(tmp_path):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        load_chat_template_source(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>"}))
    (tmp_path / "chat_template.jinja").write_text("{{ eos_token }}")
    assert ChatTemplate.from_dir(tmp_path).render([]) == "<e>"
