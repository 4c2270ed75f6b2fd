"""`pyengine kv-depth`: the first users' A/B of two configurations (e.g. KV cache dtypes) by depth.

For each configuration (two endpoints: --base_url and --base_url_b; or in-process, one
--config "ENGINE FLAGS" each), one after the other so they never share the machine:
  short    short-context decode speed: --warmups unmeasured requests, then --runs measured
           (the code prompt, --max_tokens, ignore_eos; median)
  probes   one cache-busted request per --depths entry (a fresh nonce first): prefill tokens/s
           (prompt tokens / first-token time) and decode speed at that depth
  session  an agent session of --turns turns, each adding a tool-output-like user message and
           keeping the model's reply, growing to --session_tokens: first-token time, decode
           speed, prompt and cached tokens per turn
Depths beyond the endpoint's context are capped to 90 % of it (said on stderr and in the JSON).
"""

from __future__ import annotations

import random
import sys

from .client import ChatRequest, Client
from .metrics import median, stream_metrics
from .progress import progress
from .texts import bench_prompts, chars_per_token, log_lines, long_messages


def targets(args) -> list[tuple[str | None, str | None, str | None]] | str:
    """(base_url, engine flags, label) per configuration, or the usage error."""
    urls = [u for u in (args.base_url, args.base_url_b) if u]
    if urls and args.config:
        return "give endpoints (--base_url, --base_url_b) or in-process --config flags, not both"
    if args.base_url_b and not args.base_url:
        return "--base_url_b needs --base_url"
    configs = [(u, None) for u in urls] or [(None, c) for c in (args.config or [None])]
    if len(configs) > 2:
        return "at most two configurations (an A/B)"
    labels = args.label or []
    if len(labels) > len(configs):
        return f"{len(labels)} labels for {len(configs)} configurations"
    labels += [None] * (len(configs) - len(labels))
    return [(u, c, lab) for (u, c), lab in zip(configs, labels)]


def _cap(tokens: int, client: Client, reserve: int, what: str) -> int:
    limit = client.max_model_len
    if limit and tokens + reserve > 0.9 * limit:
        capped = max(1, int(0.9 * limit) - reserve)
        print(f"kv-depth: {what} {tokens} tokens capped to {capped} ({client.label} has a "
              f"{limit}-token context)", file=sys.stderr)  # fmt: skip
        return capped
    return tokens


def run_config(client: Client, args) -> dict:
    thinking = None if args.thinking is None else args.thinking == "on"
    rng = random.Random(args.seed)
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    steps = args.warmups + args.runs + len(depths) + args.turns + 1
    with progress(steps, f"kv-depth {client.label}", "req") as bar:
        cpt = chars_per_token(client, args.seed)
        bar.update(1)

        def request(messages, **kw) -> dict:
            r = client.run(ChatRequest(messages, max_tokens=args.max_tokens, temperature=0.0, seed=args.seed,
                                       ignore_eos=True, thinking=thinking, **kw))  # fmt: skip
            bar.update(1)
            return {**stream_metrics(r), "_result": r}

        short_messages = bench_prompts()["code"]
        for _ in range(args.warmups):
            request(short_messages)
        short = [request(short_messages) for _ in range(args.runs)]
        probes = []
        for depth in depths:
            asked = _cap(depth, client, args.max_tokens, "probe depth")
            p = request(long_messages(asked, cpt, rng))
            p["depth_asked"] = depth
            p["prefill_tok_s"] = p["prompt_tokens"] / p["ttft_s"] if p["prompt_tokens"] and p["ttft_s"] else None
            probes.append(p)
        session = _session(request, args, client, cpt, rng)
    return {
        "chars_per_token": cpt,
        "short": {"decode_tok_s": median([s["decode_tok_s"] for s in short]),
                  "ttft_s": median([s["ttft_s"] for s in short]), "runs": _clean(short)},
        "probes": _clean(probes), "session": _clean(session),
    }  # fmt: skip


_TURN_OVERHEAD_TOKENS = 30  # the turn's wrapper text and chat-template markers, about


def _session(request, args, client: Client, cpt: float, rng: random.Random) -> list[dict]:
    """Turn k's prompt aims at k/turns of the final depth: each turn's log is sized from what
    the server counted so far, so chat-template overhead and replies do not push it past."""
    final = _cap(args.session_tokens, client, 2 * args.max_tokens, "session depth")
    messages = [{"role": "system", "content": "You are an agent that reads service logs and answers briefly."}]
    turns, so_far = [], 0
    for turn in range(args.turns):
        target = final * (turn + 1) // args.turns
        log = log_lines(int(max(1, target - so_far - _TURN_OVERHEAD_TOKENS) * cpt), rng)
        messages.append({"role": "user", "content": f"Tool output {turn + 1}:\n{log}\nWhat stands out?"})
        t = request(messages)
        t["turn"] = turn + 1
        r = t["_result"]
        messages.append({"role": "assistant", "content": r.content or r.output})
        so_far = (t["prompt_tokens"] or target) + t["completion_tokens"]
        turns.append(t)
    return turns


def _clean(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "_result"} for row in rows]


def table(result: dict) -> str:
    rows = []
    for cfg in result["configs"]:
        rows.append(f"== {cfg['label']}: short context decode {_f(cfg['short']['decode_tok_s'])} tok/s, "
                    f"TTFT {_f(cfg['short']['ttft_s'], 3)} s")  # fmt: skip
        for p in cfg["probes"]:
            rows.append(f"   probe {p['prompt_tokens']} tokens: prefill {_f(p['prefill_tok_s'])} tok/s, "
                        f"TTFT {_f(p['ttft_s'], 3)} s, decode {_f(p['decode_tok_s'])} tok/s")  # fmt: skip
        rows.append("   turn  prompt  cached  TTFT s  decode tok/s")
        for t in cfg["session"]:
            rows.append(f"   {t['turn']:>4}  {t['prompt_tokens'] or 0:>6}  {t['cached_tokens'] or 0:>6}  "
                        f"{_f(t['ttft_s'], 3):>6}  {_f(t['decode_tok_s']):>12}")  # fmt: skip
    return "\n".join(rows)


def _f(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
