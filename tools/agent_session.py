"""Agent-session benchmark: an agent's turns, each an assistant tool call answered by a tool
result of N tokens, against any OpenAI-compatible endpoint or an in-process engine.

Per turn: the first-token time (request sent -> first token of the answer, measured by the
client), the prompt tokens, and how many of them were computed (prompt - cached, from usage
or the engine's final event). The prompt of turn k is the whole conversation so far, so a
server without a working prefix cache for hybrid models recomputes it all and its first-token
time grows with the context; with one, each turn prefills only its new tokens. The report ends
with turn-15 / turn-2 first-token time, and a PNG plots first-token time against context.

The assistant turns are forced tool calls (tool_choice "required"): the tool's parameters are
an enum and a bounded integer, so even a random-weight model writes a short valid call.
The tool results are synthetic log lines, sized to N tokens by --tokenizer (the model's own in
process; the embedded model's by default for endpoints).

  python3 tools/agent_session.py                              # in process, embedded model, CPU
  python3 tools/agent_session.py --url http://127.0.0.1:8000/v1 --api-key KEY
  python3 tools/agent_session.py --shape 27b --device cuda --tool-tokens 3000   # dummy weights
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOOL = {
    "type": "function",
    "function": {
        "name": "read_log",
        "description": "Read a window of a service's log.",
        "parameters": {
            "type": "object",
            "properties": {
                "service": {"type": "string", "enum": ["api", "worker", "scheduler", "db", "cache"]},
                "offset": {"type": "integer", "minimum": 0, "maximum": 100000},
            },
            "required": ["service", "offset"],
        },
    },
}
SYSTEM = "You are an on-call agent. Read the logs with the read_log tool until you find the cause."
TASK = "The nightly export failed at 02:14. Find out why."


@dataclass
class Turn:
    turn: int
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    ttft_s: float
    call: str


def tool_output(n_tokens: int, count, seed: int) -> str:
    """Synthetic log lines, cut to n_tokens by `count` (text -> number of tokens)."""
    r = random.Random(seed)
    levels, words = ["INFO", "WARN", "DEBUG", "ERROR"], ["export", "batch", "retry", "shard", "queue",
                                                           "commit", "timeout", "lock", "flush", "row"]  # fmt: skip
    lines, text = [], ""
    while True:
        lines.append(f"02:{r.randrange(60):02d}:{r.randrange(60):02d} {r.choice(levels)} "
                     f"{' '.join(r.choice(words) for _ in range(6))} id={r.randrange(10**6)}")
        text = "\n".join(lines)
        if count(text) >= n_tokens:
            break
    while count(text) > n_tokens and text:  # trim the last line to land on n_tokens
        text = text[:-1]
    return text


class InProcess:
    """The pyengine LLM directly: first token = first token event of the stream."""

    def __init__(self, args):
        from pyengine import LLM, SamplingParams, StructuredOutputsParams

        self.SamplingParams, self.StructuredOutputsParams = SamplingParams, StructuredOutputsParams
        kw = dict(device=args.device, max_batch=2, max_model_len=args.max_model_len,
                  chunked_prefill_size=args.chunk, prefix_cache=not args.no_prefix_cache)  # fmt: skip
        model = args.model
        if args.shape == "27b":
            model = write_27b_dir()
            kw.update(load_format="dummy", weight_quant="fp8", gpu_mem_ratio=0.92)
        self.llm = LLM(model, **kw)
        self.tokenizer = self.llm.tokenizer
        self.grammar = self.llm.tool_call_grammar([TOOL], "required", False)

    def turn(self, messages, max_tokens: int, thinking: bool):
        from pyengine.tool_calls import parse_tool_calls

        prompt = self.llm.apply_chat_template(messages, tools=[TOOL], enable_thinking=thinking)
        sp = self.SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                 structured_outputs=self.StructuredOutputsParams(grammar=self.grammar))
        t0 = time.perf_counter()
        stream = self.llm.submit(prompt=prompt, sampling_params=sp)
        ttft, text, final = None, "", None
        for ev in stream:
            if ev.token_ids and ttft is None:
                ttft = time.perf_counter() - t0
            text += ev.text
            if ev.finished:
                final = ev
        _, calls = parse_tool_calls(text, [TOOL])
        return ttft, final.prompt_tokens, final.cached_tokens, calls

    def close(self):
        self.llm.close()


class Endpoint:
    """Any OpenAI-compatible server through the official client (streamed, usage included)."""

    def __init__(self, args):
        import openai

        self.client = openai.OpenAI(base_url=args.url, api_key=args.api_key or "none", max_retries=0,
                                    timeout=600)
        self.model = args.served_model or self.client.models.list().data[0].id

    def turn(self, messages, max_tokens: int, thinking: bool):
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, tools=[TOOL], tool_choice="required",
            parallel_tool_calls=False, temperature=0, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True},
            extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        ttft, calls, usage = None, {}, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra = delta.model_extra or {}
            if ttft is None and (delta.content or delta.tool_calls or extra.get("reasoning_content")):
                ttft = time.perf_counter() - t0
            for tc in delta.tool_calls or ():
                c = calls.setdefault(tc.index, {"id": None, "type": "function",
                                                "function": {"name": "", "arguments": ""}})
                c["id"] = tc.id or c["id"]
                if tc.function:
                    c["function"]["name"] += tc.function.name or ""
                    c["function"]["arguments"] += tc.function.arguments or ""
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
        return ttft, usage.prompt_tokens, cached, [calls[i] for i in sorted(calls)]

    def close(self):
        pass


def write_27b_dir() -> str:
    """The 27B shape (tools/bench_gpu.py) with the embedded model's tokenizer and template."""
    from bench_gpu import CONFIG_27B

    from pyengine.llm import default_model_path

    d = tempfile.mkdtemp(prefix="pe27b_agent_")
    cfg = dict(CONFIG_27B)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(cfg["num_hidden_layers"])]  # fmt: skip
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(default_model_path(), name), d)
    return d


def session(runner, tokenizer, args) -> list[Turn]:
    count = (lambda text: len(tokenizer.encode(text)))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    turns = []
    for k in range(1, args.turns + 1):
        ttft, prompt_tokens, cached, calls = runner.turn(messages, args.call_tokens, args.thinking)
        if not calls:
            raise RuntimeError(f"turn {k}: no tool call in the answer")
        call = calls[0]
        call = {"id": call["id"] or f"call_{k}", "type": "function", "function": call["function"]}
        turns.append(Turn(k, prompt_tokens, cached, prompt_tokens - cached, ttft, call["function"]["arguments"]))
        print(f"turn {k:2d}: context {prompt_tokens:6d} tokens, computed {prompt_tokens - cached:6d}, "
              f"first token {ttft * 1000:8.1f} ms  {call['function']['name']}({call['function']['arguments']})",
              flush=True)
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": tool_output(args.tool_tokens, count, seed=k)})
    return turns


def plot(turns: list[Turn], path: str, title: str) -> None:
    try:
        import matplotlib
    except ImportError:  # e.g. a GPU machine without it: --replot the --json file elsewhere
        print("matplotlib is not installed: no plot (write --json and plot it with --replot)")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [t.prompt_tokens for t in turns]
    y = [t.ttft_s * 1000 for t in turns]
    computed = ax.twinx()  # what the server had to compute: flat when the prefix cache works
    computed.bar(x, [t.computed_tokens for t in turns], width=max(x) / (3 * len(x)), color="0.85",
                 label="prompt tokens computed")
    computed.set_ylabel("prompt tokens computed", color="0.4")
    computed.set_ylim(0, 1.5 * max(x))
    ax.set_zorder(computed.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot(x, y, "o-", label="first-token time")
    for t in turns:
        ax.annotate(str(t.turn), (t.prompt_tokens, t.ttft_s * 1000), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7)
    ax.set_xlabel("context (prompt tokens)")
    ax.set_ylabel("first-token time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an OpenAI-compatible base URL (.../v1); default: in process")
    ap.add_argument("--api-key")
    ap.add_argument("--served-model", help="model name at the endpoint (default: its first)")
    ap.add_argument("--model", help="in process: checkpoint directory (default: the embedded model)")
    ap.add_argument("--shape", choices=["27b"], help="in process: the 27B shape with dummy FP8 weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=512, help="in process: chunked_prefill_size")
    ap.add_argument("--no-prefix-cache", action="store_true",
                    help="in process: prefix cache off (every turn recomputes its whole prompt)")
    ap.add_argument("--tokenizer", help="checkpoint whose tokenizer sizes the tool results "
                                        "(default: the model's in process, else the embedded model)")
    ap.add_argument("--turns", type=int, default=15)
    ap.add_argument("--tool-tokens", type=int, default=1000, help="N: tokens of each tool result")
    ap.add_argument("--call-tokens", type=int, default=64, help="max_tokens of each assistant turn")
    ap.add_argument("--thinking", action="store_true", help="enable_thinking (default off)")
    ap.add_argument("--png", default="agent_session.png")
    ap.add_argument("--json", help="also write the turns as JSON here")
    ap.add_argument("--replot", help="only plot a --json file of an earlier run into --png")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        plot([Turn(**t) for t in saved["turns"]], args.png, saved["summary"])
        print(f"plot: {args.png}")
        return

    runner = Endpoint(args) if args.url else InProcess(args)
    if args.url or args.tokenizer:
        from pyengine.llm import default_model_path
        from pyengine.tokenizer import Tokenizer

        tokenizer = Tokenizer(args.tokenizer or default_model_path())
    else:
        tokenizer = runner.tokenizer
    try:
        turns = session(runner, tokenizer, args)
    finally:
        runner.close()
    where = args.url or f"in process, {args.shape or args.model or 'embedded model'} on {args.device}" + \
        (", prefix cache off" if args.no_prefix_cache else "")
    ratio = turns[-1].ttft_s / turns[1].ttft_s if len(turns) > 1 else float("nan")
    summary = (f"{where}: {args.turns} turns, tool results of {args.tool_tokens} tokens; "
               f"turn-{turns[-1].turn} / turn-2 first-token time = {ratio:.2f}")
    print(summary)
    plot(turns, args.png, summary)
    print(f"plot: {args.png}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "ratio": ratio, "turns": [asdict(t) for t in turns]}, f, indent=1)


if __name__ == "__main__":
    main()
