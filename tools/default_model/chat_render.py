"""Renders chats with the model's own jinja template, the way transformers does, so the corpus
and the shipped tokenizer_config.json can never disagree about the format."""

from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


def _raise(message):
    raise ValueError(message)


def load_template():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(TEMPLATE_PATH.read_text())


_TEMPLATE = None


def render(messages, add_generation_prompt=False, enable_thinking=True, tools=None) -> str:
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = load_template()
    return _TEMPLATE.render(messages=messages, add_generation_prompt=add_generation_prompt,
                            enable_thinking=enable_thinking, tools=tools)
