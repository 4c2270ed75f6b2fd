"""POST /v1/chat/completions and /v1/completions, streaming (SSE) and not.

Each handler checks the whole request before it submits anything, so a bad request never
touches the engine; after submission every exit path goes through `Generation`, which cancels
whatever is unfinished.
"""
import json
import logging
from contextlib import closing

from flask import Blueprint, Response, jsonify, request

from pyengine.errors import PromptTooLongError
from pyengine.reasoning import prompt_opens_reasoning
from webapp.chat_input import check_length_bound, normalize_messages, template_inputs
from webapp.agent_fields import parse_agent_fields
from webapp.disconnect import socket_from_environ
from webapp.errors import APIError, bad_request
from webapp.generation import Generation
from webapp.openai_format import (
    ChoiceState,
    ResponseMeta,
    chat_logprobs,
    completion_logprobs,
    error_chunk,
    usage,
)
from webapp.params import (
    MAX_N,
    get_bool,
    get_str,
    json_body,
    make_sampling_params,
    parse_sampling,
    resolve_max_tokens,
)
from webapp.state import state

log = logging.getLogger("webapp")
api = Blueprint("openai", __name__)


def _sampling_params_cls():
    from pyengine import SamplingParams
    return SamplingParams


def _check_model(body: dict) -> str:
    name = state().model_name
    asked = get_str(body, "model", name)
    if asked != name:
        raise APIError(404, f"The model '{asked}' does not exist; this server serves '{name}'",
                       param="model", code="model_not_found")
    return name


def _too_long(llm, exc: PromptTooLongError, param: str) -> APIError:
    return APIError(400, f"The prompt does not fit the model's context of {llm.max_model_len} "
                    f"tokens: {exc}", param=param, code="context_length_exceeded")


def _encode(llm, text: str, param: str) -> list[int]:
    """The prompt's tokens, or a 400 without tokenizing all of a prompt far over the context."""
    try:
        return llm.tokenizer.encode_within(text, llm.max_model_len - 1)
    except PromptTooLongError as exc:
        raise _too_long(llm, exc, param)
    except ValueError as exc:  # a lone surrogate or another text the tokenizer cannot take
        raise bad_request(f"Invalid text in '{param}': {exc}", param=param)


def _start(prompts: list[list[int]], sreq, prompt_param: str) -> Generation:
    st = state()
    llm = st.engine.get()
    sampling_cls = _sampling_params_cls()
    params = []
    for ids in prompts:
        max_tokens = resolve_max_tokens(sreq, len(ids), llm.max_model_len, prompt_param)
        params.append([make_sampling_params(sampling_cls, sreq, max_tokens, j)
                       for j in range(sreq.n)])
    gen = Generation(llm, st, socket_from_environ(request.environ))
    for ids, per_prompt in zip(prompts, params):
        for p in per_prompt:
            gen.submit(ids, p, return_progress=sreq.return_progress)
    return gen


def _sse(gen: Generation, chunks) -> Response:
    def body():
        try:
            try:
                for chunk in chunks:
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
            except Exception as exc:  # headers are sent: report in-band, end the stream cleanly
                log.exception("error while streaming a response")
                chunk = error_chunk(f"Internal error: {type(exc).__name__}: {exc}")
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            chunks.close()
    resp = Response(body(), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    resp.call_on_close(gen.close)  # also covers a body that was never started
    return resp


@api.post("/v1/chat/completions")
def chat_completions():
    body = json_body()
    model = _check_model(body)
    state().check_accepting()
    messages = normalize_messages(body.get("messages"))
    llm = state().engine.get()
    try:
        check_length_bound(messages, llm)
    except PromptTooLongError as exc:
        raise _too_long(llm, exc, "messages")
    _, template_kwargs = template_inputs(body, llm)  # tools are checked here, chosen by the agent fields
    sreq = parse_sampling(body, chat=True)
    agent = parse_agent_fields(body, llm)
    if agent.structured is not None:
        sreq.engine_kwargs["structured_outputs"] = agent.structured
    try:
        prompt = llm.apply_chat_template(messages, add_generation_prompt=True,
                                         tools=agent.template_tools, **template_kwargs)
    except (ValueError, TypeError) as exc:
        raise bad_request(f"Could not apply the chat template: {exc}", param="messages")
    ids = _encode(llm, prompt, "messages")
    gen = _start([ids], sreq, "messages")
    in_reasoning = prompt_opens_reasoning(prompt)
    choices = [ChoiceState(in_reasoning, tools=agent.parse_tools,
                           parallel_tool_calls=agent.parallel) for _ in range(sreq.n)]
    meta = ResponseMeta("chatcmpl", model)
    if sreq.stream:
        return _sse(gen, _chat_chunks(gen, meta, choices, len(ids), sreq))
    _collect(gen, choices)
    out = []
    for i, c in enumerate(choices):
        message = c.message()
        lp = {"content": chat_logprobs(c.logprobs, sreq.logprobs, sreq.tokens_as_ids)} \
            if sreq.logprobs is not None else None
        out.append({"index": i, "message": message, "logprobs": lp,
                    "finish_reason": c.finish_reason})
    return jsonify(**meta.head("chat.completion"), choices=out,
                   usage=_usage(choices, [len(ids)]))


def _chat_chunks(gen: Generation, meta: ResponseMeta, choices, prompt_len: int, sreq):
    head = meta.head("chat.completion.chunk")
    extra = {"usage": None} if sreq.include_usage else {}

    def chunk(index, delta, logprobs=None, finish_reason=None):
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish_reason}], **extra}

    for i in range(len(choices)):
        yield chunk(i, {"role": "assistant", "content": ""})
    with closing(gen.events()) as events:
        yield from _chat_deltas(gen, events, choices, chunk, sreq)
    if sreq.include_usage:
        yield {**head, "choices": [], "usage": _usage(choices, [prompt_len])}


def _chat_deltas(gen, events, choices, chunk, sreq):
    for index, ev in events:
        if ev.prompt_progress is not None and sreq.return_progress:
            yield {**chunk(index, {}), "prompt_progress": ev.prompt_progress}
        state_ = choices[index]
        reasoning, content = state_.add(ev)
        if ev.finish_reason == "error":
            yield error_chunk(ev.error or "the engine failed this request")
            continue
        if ev.finish_reason == "cancelled":
            yield _cut_error(gen)
            continue
        delta = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if state_.tool_deltas:
            delta["tool_calls"] = state_.tool_deltas
        lp = {"content": chat_logprobs(ev.logprobs, sreq.logprobs, sreq.tokens_as_ids)} \
            if ev.logprobs else None
        if delta or lp or ev.finished:
            yield chunk(index, delta, lp, state_.finish_reason if ev.finished else None)


@api.post("/v1/completions")
def completions():
    body = json_body()
    model = _check_model(body)
    if get_bool(body, "echo", False):
        raise bad_request("'echo' is not supported", param="echo")
    if get_str(body, "suffix"):
        raise bad_request("'suffix' is not supported", param="suffix")
    state().check_accepting()
    sreq = parse_sampling(body, chat=False)
    prompts = _tokenize_prompts(body.get("prompt"), state().engine.get(), sreq.n)
    gen = _start(prompts, sreq, "prompt")
    choices = [ChoiceState(split_reasoning=False) for _ in range(len(prompts) * sreq.n)]
    meta = ResponseMeta("cmpl", model)
    prompt_lens = [len(p) for p in prompts]
    if sreq.stream:
        return _sse(gen, _completion_chunks(gen, meta, choices, prompt_lens, sreq))
    _collect(gen, choices)
    out = []
    for i, c in enumerate(choices):
        lp = completion_logprobs(c.logprobs, sreq.logprobs, 0, sreq.tokens_as_ids)[0] \
            if sreq.logprobs is not None else None
        out.append({"index": i, "text": "".join(c.content), "logprobs": lp,
                    "finish_reason": c.finish_reason})
    return jsonify(**meta.head("text_completion"), choices=out,
                   usage=_usage(choices, prompt_lens))


def _completion_chunks(gen: Generation, meta: ResponseMeta, choices, prompt_lens, sreq):
    head = meta.head("text_completion")
    extra = {"usage": None} if sreq.include_usage else {}
    with closing(gen.events()) as events:
        yield from _completion_deltas(gen, events, choices, head, extra, sreq)
    if sreq.include_usage:
        yield {**head, "choices": [], "usage": _usage(choices, prompt_lens)}


def _completion_deltas(gen, events, choices, head, extra, sreq):
    for index, ev in events:
        if ev.prompt_progress is not None and sreq.return_progress:
            yield {**head, "choices": [{"index": index, "text": "", "logprobs": None,
                                        "finish_reason": None}], **extra,
                   "prompt_progress": ev.prompt_progress}
        state_ = choices[index]
        _, text = state_.add(ev)
        if ev.finish_reason == "error":
            yield error_chunk(ev.error or "the engine failed this request")
            continue
        if ev.finish_reason == "cancelled":
            yield _cut_error(gen)
            continue
        lp = None
        if ev.logprobs and sreq.logprobs is not None:
            lp, state_.text_offset = completion_logprobs(ev.logprobs, sreq.logprobs,
                                                         state_.text_offset, sreq.tokens_as_ids)
        if text or lp or ev.finished:
            yield {**head, "choices": [{"index": index, "text": text, "logprobs": lp,
                                        "finish_reason": ev.finish_reason if ev.finished
                                        else None}], **extra}


def _tokenize_prompts(prompt, llm, n: int) -> list[list[int]]:
    """The prompts' tokens; counts and lengths are checked before any prompt is tokenized."""
    def is_ids(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool)
                                                 and t >= 0 for t in x)
    if isinstance(prompt, str) or is_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                  or all(is_ids(p) for p in prompt)):
        prompts = prompt
    else:
        raise bad_request("'prompt' must be a string, an array of strings, an array of token "
                          "ids or an array of such arrays (non-empty)", param="prompt")
    if len(prompts) * n > MAX_N:
        raise bad_request(f"{len(prompts)} prompts x n={n} is more than {MAX_N} "
                          "completions in one request", param="prompt")
    ids = [p if isinstance(p, list) else _encode(llm, p, "prompt") for p in prompts]
    if any(not x for x in ids):
        raise bad_request("'prompt' must not be empty", param="prompt")
    return ids


def _cut_error(gen: Generation) -> dict:
    """The error a choice the server cancelled ends with ("cancelled" is no OpenAI reason)."""
    if gen.cut_by_server:
        return error_chunk("The server is shutting down; this request was cancelled before it "
                           "finished", "service_unavailable", "server_shutting_down")
    return error_chunk("The request was cancelled before it finished", "server_error",
                       "request_cancelled")


def _collect(gen: Generation, choices) -> None:
    """Run a non-streaming request to the end (closing the event generator on any exit)."""
    with closing(gen.events()) as events:
        for index, ev in events:
            choices[index].add(ev)
    for c in choices:
        if c.finish_reason == "error":
            raise APIError(500, f"The engine failed this request: {c.error}")
        if c.finish_reason == "cancelled":
            err = _cut_error(gen)["error"]
            raise APIError(503, err["message"], code=err["code"], type_=err["type"])


def _usage(choices, prompt_lens) -> dict:
    return usage(sum(prompt_lens), sum(c.completion_tokens for c in choices),
                 max((c.cached_tokens for c in choices), default=0), [c.speculative for c in choices])
