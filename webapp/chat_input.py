"""The inputs of a chat request (messages, tools, template kwargs), checked before anything is
rendered or tokenized: counts first, then the type of every nested field, each error naming it.

The counts are OpenAI's own caps (2,048 messages, 128 tools). Before rendering, the text of the
non-assistant messages is measured: a chat template renders those in full (templates rewrite
assistant turns, e.g. drop old reasoning), so more characters than the context's tokens can
cover is refused without rendering. The rendered prompt is then checked against the context by
`Tokenizer.encode_within`, which needs no full tokenization to refuse a prompt far over it.
"""
from pyengine.errors import PromptTooLongError
from webapp.errors import bad_request
from webapp.params import get_dict, get_list, get_str

MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256  # per message
MAX_TOOLS = 128

ROLES = {"system", "developer", "user", "assistant", "tool"}
_OPTIONAL_STRINGS = ("name", "tool_call_id", "reasoning_content")


def _content_text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or an array of text parts",
                          param="messages")
    if len(content) > MAX_CONTENT_PARTS:
        raise bad_request(f"{where}.content has {len(content)} parts; at most "
                          f"{MAX_CONTENT_PARTS} are allowed", param="messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise bad_request(f"{where}.content[{j}]: only text parts are supported (this model "
                              f"reads no {kind or 'such'} input)", param="messages")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content[{j}].text must be a string", param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _check_tool_calls(calls, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be an array", param="messages")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise bad_request(f"{at} must be an object with a 'function' object",
                              param="messages")
        if not isinstance(function.get("name"), str):
            raise bad_request(f"{at}.function.name must be a string", param="messages")
        if not isinstance(function.get("arguments", ""), (str, dict)):
            raise bad_request(f"{at}.function.arguments must be a string or an object",
                              param="messages")


def normalize_messages(messages) -> list[dict]:
    """The messages as the template takes them: text content, 'developer' read as 'system'."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' has {len(messages)} entries; at most {MAX_MESSAGES} are "
                          "allowed", param="messages")
    out = []
    for k, msg in enumerate(messages):
        where = f"messages[{k}]"
        if not isinstance(msg, dict):
            raise bad_request(f"{where} must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}",
                              param="messages")
        content = _content_text(msg.get("content"), where)
        for name in _OPTIONAL_STRINGS:
            if msg.get(name) is not None and not isinstance(msg[name], str):
                raise bad_request(f"{where}.{name} must be a string", param="messages")
        _check_tool_calls(msg.get("tool_calls"), where)
        out.append({**msg, "role": "system" if role == "developer" else role,
                    "content": content})
    return out


def check_length_bound(messages: list[dict], llm) -> None:
    """PromptTooLongError when the user, system and tool messages alone have more characters
    than the context's tokens can cover (no rendering, no tokenizing)."""
    per_token = llm.tokenizer.max_token_chars
    if per_token is None:
        return
    n_chars = sum(len(m["content"]) for m in messages if m["role"] != "assistant")
    limit = llm.max_model_len - 1
    if n_chars > limit * per_token:
        raise PromptTooLongError(
            f"the messages have {n_chars} characters, more than {limit} tokens can cover (a "
            f"token of this model covers at most {per_token} characters)", limit)


def _tools(body: dict) -> list | None:
    tools = get_list(body, "tools")
    if tools is None:
        return None
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' has {len(tools)} entries; at most {MAX_TOOLS} are allowed",
                          param="tools")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(function, dict):
            raise bad_request(f"tools[{j}] must be {{'type': 'function', 'function': {{...}}}}",
                              param="tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f"tools[{j}].function.name must be a non-empty string",
                              param="tools")
        if not isinstance(function.get("description", ""), str):
            raise bad_request(f"tools[{j}].function.description must be a string", param="tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_request(f"tools[{j}].function.parameters must be an object", param="tools")
    return tools or None


def template_inputs(body: dict, llm) -> tuple[list | None, dict]:
    """(tools, chat template kwargs) of a chat request, checked against the model's template."""
    tools = _tools(body)  # tool_choice and response_format: webapp/agent_fields.py
    kwargs = dict(get_dict(body, "chat_template_kwargs", {}))
    try:
        llm.check_chat_template_kwargs(kwargs)
    except ValueError as exc:
        raise bad_request(f"Invalid chat_template_kwargs: {exc}", param="chat_template_kwargs")
    effort = get_str(body, "reasoning_effort")
    if effort is not None and "reasoning_effort" not in kwargs:
        try:
            llm.check_chat_template_kwargs({"reasoning_effort": effort})
        except ValueError as exc:
            raise bad_request(f"Invalid reasoning_effort: {exc}", param="reasoning_effort")
        kwargs["reasoning_effort"] = effort
    return tools, kwargs
