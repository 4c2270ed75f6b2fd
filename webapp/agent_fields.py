"""The agent fields of a chat request: tools, tool_choice, parallel_tool_calls, response_format.

Checked before anything is submitted, each error naming its field: a malformed tool, a
tool_choice naming a function that is not in `tools`, a JSON schema llguidance cannot compile
(400 with llguidance's reason). tool_choice "required" or a named function forces the calls
with a grammar (pyengine/tool_grammar.py); response_format json_object / json_schema
constrains the answer with one; when both are given, the forced tool calls win.
"""
from dataclasses import dataclass

from pyengine.structured_outputs import StructuredOutputsParams
from pyengine.tool_grammar import tool_choice_function
from webapp.errors import bad_request
from webapp.params import get_bool, get_dict, get_list


@dataclass
class AgentFields:
    template_tools: list | None   # the tools the template lists (None with tool_choice "none")
    parse_tools: list | None      # the tools whose calls are parsed out of the answer
    structured: StructuredOutputsParams | None  # the grammar the answer must follow
    parallel: bool = True         # parallel_tool_calls


def _check_tools(tools: list) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}",
                              param="tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}].function.name must be a non-empty string", param="tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              param="tools")


def _response_format(body: dict) -> StructuredOutputsParams | None:
    fmt = get_dict(body, "response_format")
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              param="response_format")
        return StructuredOutputsParams(json=schema)
    raise bad_request("response_format.type must be 'text', 'json_object' or 'json_schema', "
                      f"got {kind!r}", param="response_format")


def _compiled(llm, params: StructuredOutputsParams, what: str, param: str):
    try:
        llm.check_structured_outputs(params)
    except ValueError as exc:
        raise bad_request(f"{what}: {exc}", param=param)
    return params


def parse_agent_fields(body: dict, llm) -> AgentFields:
    tools = get_list(body, "tools") or None
    if tools:
        _check_tools(tools)
    tool_choice = body.get("tool_choice", "auto" if tools else "none")
    try:
        named = tool_choice_function(tool_choice)
    except ValueError as exc:
        raise bad_request(str(exc), param="tool_choice")
    parallel = get_bool(body, "parallel_tool_calls", True)
    if (tool_choice == "required" or named) and not tools:
        raise bad_request("tool_choice requires a tool call but 'tools' is empty", param="tool_choice")
    structured = _response_format(body)
    if structured is not None:
        structured = _compiled(llm, structured, "response_format: the schema cannot be used",
                               "response_format")
    try:
        forced = llm.tool_call_grammar(tools, tool_choice, parallel) if tools else None
    except ValueError as exc:
        raise bad_request(str(exc), param="tool_choice")
    if forced is not None:
        structured = _compiled(llm, StructuredOutputsParams(grammar=forced),
                               "tools: a parameter schema cannot be used", "tools")
    use = tools if tool_choice != "none" else None
    return AgentFields(template_tools=use, parse_tools=use, structured=structured,
                       parallel=parallel)
