"""Flags shared by `pyengine generate` and `pyengine serve`: value types, engine flags, checks.

Every user error here ends as one line, `pyengine ...: error: ...`, never a traceback: the
value types raise argparse errors that name the flag, and `Parser.error` prints no usage block.
"""

from __future__ import annotations

import argparse
import os
import sys

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def fail(prog: str, message: str) -> int:
    """Report a user error in the same one-line form; returns the exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def byte_size(text: str) -> int:
    """'4096', '512M', '20G', '1.5g' -> bytes (binary units)."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(s[-1:], 1)
    number = s[:-1] if s[-1:] in _SUFFIXES else s
    try:
        value = int(float(number) * scale)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 4096, 512M, 20G)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def int_in(low: int, high: int):
    """An int type for argparse accepting low <= x <= high."""

    def parse(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}]: {text!r}")
        return value

    return parse


def port_number(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free port): {text!r}")
    return value


def float_in(low: float, high: float, low_open: bool = False):
    """A float type for argparse accepting low <= x <= high (low < x with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}")
        if not (low < value if low_open else low <= value) or not value <= high:
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be in {bounds}: {text!r}")
        return value

    return parse


def check_model_dir(model: str | None) -> str | None:
    """Why `model` cannot be served (None: fine), before any slow loading starts."""
    if model is None:
        from pyengine.llm import default_model_path  # cheap: the library loads on first use

        if default_model_path() is None:
            return ("no model given and this build has no embedded model: name a checkpoint "
                    "directory (pyengine serve MODEL_DIR, pyengine generate --model MODEL_DIR)")
        return None
    if not os.path.isdir(model):
        return f"model directory not found: {model}"
    if not os.path.isfile(os.path.join(model, "config.json")):
        return f"not a model directory (no config.json): {model}"
    from pyengine.config import ModelConfig  # pure Python: reads the two small JSON files
    from pyengine.errors import CheckpointError

    try:
        ModelConfig.from_dir(model)
    except CheckpointError as exc:
        return str(exc)
    return None


def cuda_problem() -> str | None:
    """Why --device cuda cannot work in this process (None: a GPU is usable)."""
    from pyengine._native import cuda_available, native
    from pyengine.errors import EngineError

    try:
        if cuda_available():
            return None
        build = native().build_info
    except EngineError as exc:
        return str(exc)
    if "cuda" not in build:
        return (f"--device cuda: this pyengine was built without the CUDA backend (build: {build}); "
                "on a machine with a GPU reinstall it with `PYENGINE_CUDA=ON pip install .`")
    return f"--device cuda: no usable CUDA GPU found (build: {build}); use --device cpu"


def add_engine_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Engine flags, named as FastLLM / vLLM users know them."""
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                   help="where the model runs (auto: cuda when a GPU is usable; default: cpu)")
    p.add_argument("--max_batch", type=positive_int, default=8,
                   help="most requests decoded together (default: 8)")
    p.add_argument("--max_model_len", type=positive_int, default=None,
                   help="longest prompt + output in tokens (default: the model's, at most 8192)")
    p.add_argument("--chunked_prefill_size", type=positive_int, default=512,
                   help="prompt tokens prefilled per step and request (default: 512)")
    p.add_argument("--max_num_batched_tokens", type=non_negative_int, default=0,
                   help="token budget of one step (0: max_batch + chunked_prefill_size)")
    p.add_argument("--cooperative_prefill", choices=["on", "off"], default="on",
                   help="admit waiting requests at every chunk of a long prefill (default: on)")
    p.add_argument("--prefix_cache", choices=["on", "off"], default="on",
                   help="reuse the KV pages and GDN states of shared prompt prefixes (default: on)")
    p.add_argument("--kv_page_size", type=positive_int, default=16,
                   help="tokens per KV cache page (default: 16)")
    p.add_argument("--kv_cache_bytes", type=byte_size, default=None,
                   help="KV + GDN state budget, e.g. 8G (default: planned from free memory)")
    p.add_argument("--gpu_mem_ratio", type=float_in(0.0, 1.0, low_open=True), default=0.9,
                   help="share of free GPU memory the engine may plan with (default: 0.9)")
    p.add_argument("--kv_cache_dtype", default="auto",
                   choices=["auto", "fp32", "fp16", "bf16", "fp8_e4m3", "int8", "fp4"],
                   help="KV cache element type (auto: fp32 on the CPU, fp16 on CUDA)")
    p.add_argument("--weight_quant", default=None, choices=["int8", "fp8", "nvfp4"],
                   help="quantize 16-bit weights at load (embeddings and lm_head stay as loaded)")
    p.add_argument("--load_format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of the config's shapes (benchmarks)")
    p.add_argument("--prefill_weight_copy", default="auto", choices=["auto", "on", "off"],
                   help="FP8 weights on an H100 / H200: keep a row-major copy of each layer matrix for the prefill "
                        "GEMM (no per-step weight untiling; costs the FP8 weights' memory again). auto: where the "
                        "copies take at most a quarter of the GPU's memory")
    p.add_argument("--threads", type=non_negative_int, default=0,
                   help="CPU threads of the engine (default 0: all cores)")
    p.add_argument("--overlap_schedule", default="auto", choices=["auto", "on", "off"],
                   help="queue the next decode step before reading the current one's tokens (auto: on for cuda)")
    p.add_argument("--max_step_ms", type=float, default=0.0,
                   help="time limit of a step while requests decode: a long prompt's prefill is cut to fit, so "
                        "they keep streaming (0: derived from measured step costs, keeping the prefill at 80 %% "
                        "of its full-chunk speed; < 0: off)")
    p.add_argument("--tp", "--tensor_parallel_size", dest="tensor_parallel_size", type=positive_int, default=1,
                   help="ranks the model is split over, one process each (one GPU each on cuda; default: 1)")
    p.add_argument("--speculative_algorithm", default="auto", choices=["auto", "none", "mtp", "dflash"],
                   help="speculative decoding: mtp drafts with the checkpoint's MTP head, dflash with a DFlash "
                        "draft model (--speculative_draft_model_path); verified in the normal step, lossless at "
                        "every temperature. auto (default): the proposer the model directory names in its "
                        "speculative.json (the embedded model's: its better one, DFlash), none without one; a DFlash "
                        "draft runs at --tp 1 only, above it the file's tensor_parallel_fallback (the embedded "
                        "model's: mtp)")
    p.add_argument("--speculative_draft_model_path", default=None,
                   help="the DFlash draft model's directory (speculative_algorithm dflash)")
    p.add_argument("--speculative_num_draft_tokens", type=int_in(1, 8), default=None,
                   help="the most drafts a request verifies per step, 1-8; each request adapts its own "
                        "number to its acceptance within it (default: 3 for mtp, the draft's block size - 1 "
                        "for dflash)")
    p.add_argument("--draft_quant", default=None, choices=["none", "fp8", "int8", "nvfp4"],
                   help="quantize the DFlash draft's weights at load (default: none)")


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
        prefill_weight_copy=None if args.prefill_weight_copy == "auto" else args.prefill_weight_copy == "on",
        overlap_schedule=None if args.overlap_schedule == "auto" else args.overlap_schedule == "on",
        max_step_ms=args.max_step_ms,
        tensor_parallel_size=args.tensor_parallel_size,
        speculative_algorithm=args.speculative_algorithm,
        speculative_draft_model_path=args.speculative_draft_model_path,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        draft_quant=args.draft_quant,
    )
