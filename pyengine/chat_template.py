"""Renders a checkpoint's own chat template, the way transformers' apply_chat_template does.

Templates come from the model repository, so they run in jinja2's immutable sandbox. The
environment copies transformers' (trim_blocks, lstrip_blocks, loopcontrols, a tojson that does
not HTML-escape, raise_exception, strftime_now) so that a template renders the same text here
as in the reference; a different byte would change the prompt tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer import TOKENIZER_CONFIG_FILE_NAME, read_tokenizer_config, special_token_text

CHAT_TEMPLATE_FILE_NAME = "chat_template.jinja"

# Variables render() sets itself; a caller's template_kwargs may not override them.
_RENDER_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
# Types of the template variables clients commonly set (other variables take any JSON value).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
_KWARG_CHECKS = {
    "enable_thinking": (lambda v: isinstance(v, bool), "true or false"),
    "reasoning_effort": (lambda v: v in REASONING_EFFORTS,
                         "one of " + ", ".join(f"'{e}'" for e in REASONING_EFFORTS)),
}


class ChatTemplateError(ValueError):
    """No chat template, a template that does not compile, or one that fails to render."""


class _GenerationTagExtension(jinja2.ext.Extension):
    """Accepts {% generation %}...{% endgeneration %}, which transformers uses to mark assistant
    tokens for training masks; for inference the block renders as its plain content."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(
            lineno
        )

    def _render_body(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False
) -> str:
    # jinja's own tojson escapes <, >, & for HTML; transformers' (and so the model's training
    # data) does not.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTagExtension, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def load_chat_template_source(
    model_dir: str | os.PathLike, tokenizer_config: dict | None = None
) -> str:
    """The template text: tokenizer_config.json's chat_template (a string, or a list of
    {name, template} of which "default" is taken), else chat_template.jinja."""
    model_dir = os.fspath(model_dir)
    config = read_tokenizer_config(model_dir) if tokenizer_config is None else tokenizer_config
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ChatTemplateError(
                f"{TOKENIZER_CONFIG_FILE_NAME}: chat_template lists {sorted(map(str, named))} "
                "but no 'default'"
            )
        template = named["default"]
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"{TOKENIZER_CONFIG_FILE_NAME}: chat_template is not a string")
    if template:
        return template
    path = os.path.join(model_dir, CHAT_TEMPLATE_FILE_NAME)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    raise ChatTemplateError(
        f"{model_dir}: no chat template (neither chat_template in {TOKENIZER_CONFIG_FILE_NAME} "
        f"nor {CHAT_TEMPLATE_FILE_NAME})"
    )


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None] | None = None):
        """special_tokens: bos_token, eos_token ... as the template sees them."""
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = _make_environment()
        try:
            self._template = env.from_string(source)
            read = jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template does not compile: {e.message} (line {e.lineno})"
            ) from None
        # The variables a caller may set: those the template reads (a superset: jinja counts
        # some variables set in inner scopes too), less what render() and the tokenizer set.
        self.variables = frozenset(read - set(env.globals) - _RENDER_VARIABLES
                                   - set(self.special_tokens))

    def check_kwargs(self, template_kwargs: dict) -> None:
        """ChatTemplateError naming the first kwarg this template cannot take: one render() or
        the tokenizer sets, one the template never reads, or a known one of the wrong type."""
        for name, value in template_kwargs.items():
            if name in _RENDER_VARIABLES or name in self.special_tokens:
                raise ChatTemplateError(
                    f"'{name}' is set by the server, not by chat_template_kwargs"
                )
            if name not in self.variables:
                known = ", ".join(sorted(self.variables)) or "none"
                raise ChatTemplateError(
                    f"this model's chat template has no variable '{name}' (it reads: {known})"
                )
            check = _KWARG_CHECKS.get(name)
            if check is not None and not check[0](value):
                raise ChatTemplateError(f"'{name}' must be {check[1]}, got {value!r}")

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> ChatTemplate:
        config = read_tokenizer_config(model_dir)
        special_tokens = {
            key: special_token_text(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if key in config
        }
        return cls(load_chat_template_source(model_dir, config), special_tokens)

    def render(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
        documents: Sequence[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text. template_kwargs (enable_thinking, reasoning_effort ...) reach the
        template as variables and override the special tokens of the same name; servers check
        them with check_kwargs() first."""
        variables = {**self.special_tokens, **template_kwargs}
        try:
            return self._template.render(
                messages=list(messages),
                tools=None if tools is None else list(tools),
                documents=None if documents is None else list(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as e:
            # raise_exception() in the template lands here: its message is the cause.
            raise ChatTemplateError(f"chat template error: {e.message or e}") from None
        except Exception as e:  # a template is arbitrary code: any failure is its failure
            raise ChatTemplateError(
                f"chat template failed to render: {type(e).__name__}: {e}"
            ) from None
