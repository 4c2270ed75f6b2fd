"""The grammar that forces Qwen3.5 tool calls (tool_choice "required" or a named function).

A Lark grammar in llguidance's dialect: one call (or several, with parallel_tool_calls) in the
format tool_calls.py parses, of the allowed functions only, with the parameters in schema
order (required ones always, optional ones may be left out). String parameters are raw text up
to "\\n</parameter>"; string enums are their literals; every other value is JSON of the
parameter's schema (llguidance's %json).
"""

from __future__ import annotations

import json

from .structured_outputs import JSON_DEFAULTS


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _function(tool) -> dict:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError("every tool needs function.name (a non-empty string)")
    return fn


def _value_rule(schema, defs) -> str:
    """The grammar of one parameter's text, up to and including its closing tag."""
    close = _lit("\n</parameter>\n")
    if not isinstance(schema, dict):
        schema = {}
    if schema.get("type") == "string" and isinstance(schema.get("enum"), list) and \
            all(isinstance(v, str) for v in schema["enum"]) and schema["enum"]:  # fmt: skip
        return "(" + " | ".join(_lit(v) for v in schema["enum"]) + ") " + close
    if schema.get("type") == "string" or not schema:
        return "free_text"
    sub = dict(schema)
    if defs and "$defs" not in sub:
        sub["$defs"] = defs
    sub.setdefault("x-guidance", JSON_DEFAULTS)
    return "%json " + json.dumps(sub, ensure_ascii=False) + " " + close


def tool_call_grammar(tools: list[dict], name: str | None = None, parallel: bool = True,
                      tag=_lit) -> str:  # fmt: skip
    """Calls of `tools` (only of `name` when given); ValueError if it names no tool. tag(text)
    spells "<tool_call>" / "</tool_call>" in the grammar: a literal, or the special-token form
    `<[id]>` for tokenizers that have them as single tokens (GrammarCompiler.tag)."""
    fns = [_function(t) for t in tools or ()]
    if name is not None:
        fns = [f for f in fns if f["name"] == name]
        if not fns:
            raise ValueError(f"tool_choice names the function {name!r}, which is not in tools")
    if not fns:
        raise ValueError("tool_choice requires a tool call but no tools are given")
    rules = [
        "%llguidance {}",
        "start: call" + (' ("\\n" call)*' if parallel else ""),
        f'call: {tag("<tool_call>")} "\\n" (' + " | ".join(f"fn_{i}" for i in range(len(fns)))
        + f') "</function>\\n" {tag("</tool_call>")}',
        # Lazy: the shortest text that ends with the closing tag, so the value cannot hold it.
        'free_text[lazy]: /(?s:.*)\\n<\\/parameter>\\n/',
    ]
    for i, fn in enumerate(fns):
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        required = set(params.get("required") or ())
        parts = [_lit(f"<function={fn['name']}>\n")]
        for j, (pname, schema) in enumerate(props.items()):
            rule = f"p_{i}_{j}"
            rules.append(f"{rule}: {_lit(f'<parameter={pname}>' + chr(10))} {_value_rule(schema, params.get('$defs'))}")
            parts.append(rule if pname in required else rule + "?")
        rules.append(f"fn_{i}: " + " ".join(parts))
    return "\n".join(rules) + "\n"


def tool_choice_function(tool_choice) -> str | None:
    """The function a tool_choice names ({"type": "function", "function": {"name": ...}}), else
    None for "none" / "auto" / "required"; ValueError for anything else."""
    if tool_choice in (None, "none", "auto", "required"):
        return None
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str) and tool_choice.get("type", "function") == "function":
        return fn["name"]
    raise ValueError('tool_choice must be "none", "auto", "required" or '
                     '{"type": "function", "function": {"name": ...}}')


def forced_tool_grammar(tools, tool_choice, parallel: bool, tag=_lit) -> str | None:
    """The Lark grammar that tool_choice "required" or a named function imposes (None for
    "none" / "auto")."""
    name = tool_choice_function(tool_choice)
    if tool_choice != "required" and name is None:
        return None
    return tool_call_grammar(tools, name, parallel and name is None, tag)
