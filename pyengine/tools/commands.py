"""Arguments and dispatch of `pyengine bench | stress | kv-depth | eval`.

pyengine/cli.py calls add_subparsers() (so `pyengine --help` lists the commands) and hands any
argv that starts with one of NAMES to main(). Flags are spelled with underscores like the other
commands; `--bisect-metric` / `--bisect-threshold` also as `--bisect_metric` / `--bisect_threshold`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from .client import Client, EndpointError

NAMES = ("bench", "stress", "kv-depth", "eval")
_HELP = {
    "bench": "throughput: code / math / prose chats, TTFT, TPOT, ITL, tok/s, speculative acceptance",
    "stress": "long prefills with short requests inserted, cancels, concurrency: ratios, errors, wrong answers",
    "kv-depth": "A/B of two configurations by context depth: prefill probes and a multi-turn agent session",
    "eval": "a small capability check: final numbers, multiple choice, code run against tests",
}


def add_subparsers(sub) -> None:
    for name in NAMES:
        sub.add_parser(name, help=_HELP[name], add_help=False)


def _common(p: argparse.ArgumentParser, max_tokens: int, runs: int | None, concurrency: int | None) -> None:
    """The flags every command shares; runs / concurrency only where the command uses them."""
    p.add_argument("--base_url", default=None,
                   help="an OpenAI-compatible /v1 base, e.g. http://127.0.0.1:8000/v1 "
                        "(without it: in-process on --model)")  # fmt: skip
    p.add_argument("--model", default=None,
                   help="with --base_url: the model id to send (default: the first of /models); "
                        "without: a checkpoint directory (default: the embedded model)")  # fmt: skip
    p.add_argument("--api_key", default=os.environ.get("PYENGINE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="Bearer key for --base_url (default: $PYENGINE_API_KEY or $OPENAI_API_KEY)")
    p.add_argument("--max_tokens", type=_positive, default=max_tokens, help=f"tokens per request (default {max_tokens})")
    if runs is not None:
        p.add_argument("--runs", type=_positive, default=runs, help=f"measured repetitions (default {runs})")
    if concurrency is not None:
        p.add_argument("--concurrency", type=_positive, default=concurrency,
                       help=f"concurrent streams (default {concurrency})")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice and request (default 0)")
    p.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="send chat_template_kwargs.enable_thinking (default: the server's template default)")
    p.add_argument("--out", default=None, metavar="FILE.json", help="write the results as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw the results (needs matplotlib)")
    from ..cli import add_engine_arguments

    add_engine_arguments(p.add_argument_group("in-process engine (without --base_url)"))


def _positive(text: str) -> int:
    from ..cli import positive_int

    return positive_int(text)


def _bench_flags(b: argparse.ArgumentParser) -> None:
    _common(b, max_tokens=512, runs=3, concurrency=2)
    b.add_argument("--kinds", default="code,math,prose", help="prompt kinds (default code,math,prose)")
    b.add_argument("--warmup", type=int, default=1, help="unmeasured requests first (default 1)")
    b.add_argument("--bisect-metric", "--bisect_metric", dest="bisect_metric", default=None, metavar="NAME",
                   help="exit 0 (good) / 1 (bad) / 125 (skip) for git bisect run: accept_posK, tok_s, "
                        "decode_tok_s, combined_tok_s, ttft_s, tpot_s, optionally :KIND")  # fmt: skip
    b.add_argument("--bisect-threshold", "--bisect_threshold", dest="bisect_threshold", type=float, default=None,
                   metavar="X", help="the metric's good side starts here (a fraction for accept_posK)")


def _stress_flags(s: argparse.ArgumentParser) -> None:
    _common(s, max_tokens=64, runs=None, concurrency=2)
    s.add_argument("--cycles", type=_positive, default=10, help="cycles of the four scenarios (default 10)")
    s.add_argument("--max_time_s", type=float, default=1800.0, help="start no cycle after this (default 1800)")
    s.add_argument("--long_tokens", type=_positive, default=None,
                   help="long prompt size (default: 54000 or 90%% of the context, the smaller)")


def _kv_depth_flags(k: argparse.ArgumentParser) -> None:
    _common(k, max_tokens=128, runs=5, concurrency=None)
    k.add_argument("--base_url_b", default=None, help="the second endpoint to compare with --base_url")
    k.add_argument("--config", action="append", default=None, metavar="FLAGS",
                   help="in-process: engine flags of one configuration, e.g. \"--kv_cache_dtype int8\" "
                        "(give it twice for an A/B)")  # fmt: skip
    k.add_argument("--label", action="append", default=None, help="a name per configuration")
    k.add_argument("--depths", default="10000,90000", help="prefill probe depths in tokens (default 10000,90000)")
    k.add_argument("--turns", type=_positive, default=15, help="agent session turns (default 15)")
    k.add_argument("--session_tokens", type=_positive, default=58000,
                   help="the agent session's final depth in tokens (default 58000)")
    k.add_argument("--warmups", type=int, default=3, help="short-context warm-ups (default 3)")


def _eval_flags(e: argparse.ArgumentParser) -> None:
    _common(e, max_tokens=512, runs=None, concurrency=1)
    e.add_argument("--data", default=None, help="an eval JSONL (default: the shipped set)")
    e.add_argument("--limit", type=int, default=None, help="the first N items of each type only")
    e.add_argument("--timeout_s", type=float, default=10.0, help="wall time per code test run (default 10)")
    e.add_argument("--memory_mb", type=int, default=1024, help="address space per code test run (default 1024)")


_FLAGS = {"bench": (_bench_flags, "bench"), "stress": (_stress_flags, "stress"),
          "kv-depth": (_kv_depth_flags, "kv_depth"), "eval": (_eval_flags, "eval_harness")}  # fmt: skip


def build_parser(command: str) -> argparse.ArgumentParser:
    add_flags, module = _FLAGS[command]
    parser = argparse.ArgumentParser(prog=f"pyengine {command}", description=_doc(module),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_flags(parser)
    parser.set_defaults(command=command)
    return parser


def _doc(module: str) -> str:
    import importlib

    doc = importlib.import_module(f"{__package__}.{module}").__doc__ or ""
    return doc.strip()


# ---- clients ----
def open_client(args: argparse.Namespace, base_url: str | None, engine_flags: str | None = None,
                label: str | None = None) -> Client:  # fmt: skip
    if base_url:
        from .http_client import HttpClient

        client = HttpClient(base_url, args.model, args.api_key)
        if label:
            client.label = label
        return client
    from ..cli import engine_kwargs
    from .inprocess_client import InProcessClient

    ns = args
    if engine_flags:
        engine_parser = argparse.ArgumentParser(prog="--config")
        from ..cli import add_engine_arguments

        add_engine_arguments(engine_parser)
        ns = engine_parser.parse_args(shlex.split(engine_flags))
    kwargs = dict(engine_kwargs(ns), device=ns.device)
    return InProcessClient(args.model, kwargs, label=label or (f"in-process {engine_flags}" if engine_flags else None))


def thinking(args) -> bool | None:
    return None if args.thinking is None else args.thinking == "on"


def write_outputs(args, result: dict, plot) -> None:
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)


def _settings(args) -> dict:
    keep = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
    return json.loads(json.dumps(keep, default=str))


# ---- commands ----
def _bench(args) -> int:
    from . import bench, bisect

    if (args.bisect_metric is None) != (args.bisect_threshold is None):
        print("pyengine bench: error: --bisect-metric and --bisect-threshold go together", file=sys.stderr)
        return 2
    if args.bisect_metric and (problem := bisect.check_name(args.bisect_metric)):
        print(f"pyengine bench: error: {problem}", file=sys.stderr)
        return 2
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    try:
        client = open_client(args, args.base_url)
    except EndpointError as exc:
        return _unreachable("bench", exc, bisect.SKIP if args.bisect_metric else 1)
    try:
        t0 = time.time()
        result = bench.run_bench(client, kinds, args.concurrency, args.runs, args.max_tokens, args.seed,
                                 thinking(args), args.warmup)  # fmt: skip
        result = {"command": "bench", "target": client.describe(), "settings": _settings(args),
                  "started": t0, "wall_s": time.time() - t0, **result}  # fmt: skip
    finally:
        client.close()
    print(bench.table(result))
    from .plots import plot_bench

    if args.bisect_metric:
        value, higher = bisect.metric_value(result, args.bisect_metric)
        code = bisect.verdict(value, args.bisect_threshold, higher)
        result["bisect"] = {"metric": args.bisect_metric, "value": value, "threshold": args.bisect_threshold,
                            "exit": code}  # fmt: skip
        print(f"bisect: {args.bisect_metric} = {value} vs threshold {args.bisect_threshold}: "
              f"{ {0: 'good', 1: 'bad', 125: 'skip'}[code] } (exit {code})")  # fmt: skip
        write_outputs(args, result, plot_bench)
        return code
    write_outputs(args, result, plot_bench)
    return 0


def _unreachable(command: str, exc: Exception, code: int) -> int:
    print(f"pyengine {command}: error: {exc}", file=sys.stderr)
    return code


def _stress(args) -> int:
    from . import stress
    from .plots import plot_stress

    try:
        client = open_client(args, args.base_url)
    except EndpointError as exc:
        return _unreachable("stress", exc, 1)
    try:
        result = stress.run_stress(client, args)
        result = {"command": "stress", "target": client.describe(), "settings": _settings(args), **result}
    except EndpointError as exc:  # a solo reference failed: there is nothing to compare against
        return _unreachable("stress", exc, 1)
    finally:
        client.close()
    print(stress.table(result))
    write_outputs(args, result, plot_stress)
    return 0


def _kv_depth(args) -> int:
    from . import kv_depth
    from .plots import plot_kv_depth

    targets = kv_depth.targets(args)
    if isinstance(targets, str):
        print(f"pyengine kv-depth: error: {targets}", file=sys.stderr)
        return 2
    configs = []
    for base_url, flags, label in targets:
        try:
            client = open_client(args, base_url, flags, label)
        except EndpointError as exc:
            return _unreachable("kv-depth", exc, 1)
        try:
            configs.append({"label": label or client.label, "target": client.describe(),
                            **kv_depth.run_config(client, args)})  # fmt: skip
        finally:
            client.close()
    result = {"command": "kv-depth", "settings": _settings(args), "configs": configs}
    print(kv_depth.table(result))
    write_outputs(args, result, plot_kv_depth)
    return 0


def _eval(args) -> int:
    from . import eval_harness
    from .plots import plot_eval

    try:
        items = eval_harness.load_items(args.data, args.limit)
    except (OSError, ValueError) as exc:
        print(f"pyengine eval: error: {exc}", file=sys.stderr)
        return 2
    try:
        client = open_client(args, args.base_url)
    except EndpointError as exc:
        return _unreachable("eval", exc, 1)
    try:
        result = eval_harness.run_eval(client, items, args)
        result = {"command": "eval", "target": client.describe(), "settings": _settings(args), **result}
    finally:
        client.close()
    print(eval_harness.table(result))
    write_outputs(args, result, plot_eval)
    return 0


_RUN = {"bench": _bench, "stress": _stress, "kv-depth": _kv_depth, "eval": _eval}


def main(argv: list[str]) -> int:
    """argv[0] is one of NAMES."""
    args = build_parser(argv[0]).parse_args(argv[1:])
    if args.plot:
        from .plots import require_matplotlib

        problem = require_matplotlib()
        if problem:
            print(f"pyengine {args.command}: error: {problem}", file=sys.stderr)
            return 2
    return _RUN[args.command](args)
