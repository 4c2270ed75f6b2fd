"""The `pyengine` command: generate, serve."""

from __future__ import annotations

import argparse
import sys

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def byte_size(text: str) -> int:
    """'4096', '512M', '20G', '1.5g' -> bytes (binary units)."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(s[-1:], 1)
    number = s[:-1] if s[-1:] in _SUFFIXES else s
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 4096, 512M, 20G)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Engine flags, named as FastLLM / vLLM users know them."""
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--max_batch", type=positive_int, default=8)
    p.add_argument("--max_model_len", type=positive_int, default=None)
    p.add_argument("--chunked_prefill_size", type=positive_int, default=512)
    p.add_argument("--max_num_batched_tokens", type=int, default=0)
    p.add_argument("--cooperative_prefill", choices=["on", "off"], default="on")
    p.add_argument("--prefix_cache", choices=["on", "off"], default="on")
    p.add_argument("--kv_page_size", type=positive_int, default=16)
    p.add_argument("--kv_cache_bytes", type=byte_size, default=None, help="KV + GDN state budget, e.g. 8G")
    p.add_argument("--gpu_mem_ratio", type=float, default=0.9)
    p.add_argument("--kv_cache_dtype", default="auto",
                   choices=["auto", "fp32", "fp16", "bf16", "fp8_e4m3", "int8", "fp4"])
    p.add_argument("--weight_quant", default=None, choices=["int8", "fp8", "nvfp4"],
                   help="quantize 16-bit weights at load (embeddings and lm_head stay as loaded)")
    p.add_argument("--load_format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of the config's shapes (benchmarks)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("--overlap_schedule", default="auto", choices=["auto", "on", "off"],
                   help="queue the next decode step before reading the current one's tokens (auto: on for cuda)")
    p.add_argument("--max_step_ms", type=float, default=0.0,
                   help="time limit of a step while requests decode: a long prompt's prefill is cut to fit, so "
                        "they keep streaming (0: derived from measured step costs, keeping the prefill at 80 %% "
                        "of its full-chunk speed; < 0: off)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        max_batch=args.max_batch,
        max_model_len=args.max_model_len,
        chunked_prefill_size=args.chunked_prefill_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        cooperative_prefill=args.cooperative_prefill == "on",
        prefix_cache=args.prefix_cache == "on",
        kv_page_size=args.kv_page_size,
        kv_cache_bytes=args.kv_cache_bytes,
        gpu_mem_ratio=args.gpu_mem_ratio,
        num_threads=args.threads,
        kv_cache_dtype=args.kv_cache_dtype,
        weight_quant=args.weight_quant,
        load_format=args.load_format,
        overlap_schedule=None if args.overlap_schedule == "auto" else args.overlap_schedule == "on",
        max_step_ms=args.max_step_ms,
    )


def _generate(args: argparse.Namespace) -> int:
    from .llm import LLM
    from .sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, seed=args.seed)  # fmt: skip
    with LLM(args.model, device=args.device, **engine_kwargs(args)) as llm:
        prompt = args.prompt
        if not args.raw and llm._template is not None:
            prompt = llm.apply_chat_template([{"role": "user", "content": prompt}],
                                             enable_thinking=args.thinking == "on")  # fmt: skip
        stream = llm.submit(prompt=prompt, sampling_params=sp)
        for ev in stream:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            if ev.finished:
                sys.stdout.write("\n")
                print(f"[{ev.completion_tokens} tokens, finish_reason={ev.finish_reason}]", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyengine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt")
    g.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max_tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top_p", type=float, default=1.0)
    g.add_argument("--top_k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    g.add_argument("--thinking", choices=["on", "off"], default="off")
    add_engine_arguments(g)
    sub.add_parser("serve", help="serve the OpenAI-compatible API and the chat page", add_help=False)
    from .tools import commands as tool_commands  # bench, stress, kv-depth, eval

    tool_commands.add_subparsers(sub)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] and argv[0] in tool_commands.NAMES:
        return tool_commands.main(argv)
    if argv[:1] == ["serve"]:
        from . import serve

        return serve.main(argv[1:])
    args = parser.parse_args(argv)
    try:
        return _generate(args)
    except (ValueError, MemoryError) as e:
        print(f"pyengine: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
