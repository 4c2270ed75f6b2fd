"""Where each quantized GEMV launch of a decode step spends its time, from inside the kernel: the
library built by tools/gpu/lab/gemv_trace/build.sh records, per block, %globaltimer at its start,
after pdl_wait, once x is staged, once its step loops are done and at its end (gemv_trace.cuh).
This runs steady decode steps of the 27B dummy FP8 model and prints, per GEMV shape (rows x cols,
grid), medians over its launches of (us, from the launch's first pdl_wait return):
  release  first wait return - the previous GEMV launch's last block end (other kernels between
           them count in; "prev" names the previous GEMV shape)
  entry    how early the blocks started: first and last start (negative: before the release)
  staged   x staged (median over blocks; the split norm's 1 / rms included)
  loop     warps' step loops done: the first, median and last block
  end      the last block's end; epi = median block end - its loop end (sums, stream-K, epilogue)
  GB/s     the launch's weight bytes over the release-to-last-end window
Then, for shapes whose blocks differ in how many row blocks they take (stream-K), the blocks
grouped by that count and whether their first / last row block is a part split with a
neighbour: how many, and the medians of their loop end and end.
GPU machine, repo root, the trace build's library:

  tools/gpu/lab/gemv_trace/build.sh
  PYENGINE_LIBRARY=build/trace/libpyengine.so PYTHONPATH=. python3 tools/gpu/lab/gemv_trace/gemv_trace.py [--steps 8]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
from collections import defaultdict

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

REC = np.dtype([("t", "<u8", 5), ("smid", "<i4"), ("grid", "<i4"), ("block", "<i4"), ("rows", "<i4"),
                ("cols", "<i4"), ("parts", "<i4")])  # fmt: skip


def dump(lib, path: str) -> int:
    n = lib.pe_debug_gemv_trace_dump(path.encode())
    if n < 0:
        raise SystemExit("pe_debug_gemv_trace_dump failed")
    return n


def launches(recs: np.ndarray) -> list[np.ndarray]:
    """Consecutive records -> launches (a launch's blocks end before its dependent's do)."""
    out, i = [], 0
    while i < len(recs):
        g = int(recs[i]["grid"])
        chunk = recs[i : i + g]
        same = (chunk["grid"] == g) & (chunk["rows"] == recs[i]["rows"]) & (chunk["cols"] == recs[i]["cols"])
        if len(chunk) < g or not same.all() or len(set(chunk["block"].tolist())) != g:
            i += 1  # out of step (a cut launch at the start): resynchronize
            continue
        out.append(chunk)
        i += g
    return out


def record(args) -> tuple[np.ndarray, float]:
    """Steady decode steps of the 27B dummy FP8 model -> (their block records, seconds per step)."""
    from bench_gpu import decode_rate, make_engine, write_config

    lib = ctypes.CDLL(os.environ["PYENGINE_LIBRARY"])
    lib.pe_debug_gemv_trace_dump.restype = ctypes.c_longlong
    lib.pe_debug_gemv_trace_dump.argtypes = [ctypes.c_char_p]
    cfg = write_config(args.layers)
    _, engine, _ = make_engine(cfg, "fp16", 1024, args.batch, 2048, kv_cache_bytes=4 << 30)
    decode_rate(engine, args.batch, 8, 0)  # warm-up
    dump(lib, "")
    _, step_s = decode_rate(engine, args.batch, args.steps, 1)
    path = os.path.join(tempfile.mkdtemp(prefix="pe_gemv_trace_"), "trace.bin")
    dump(lib, path)
    engine.close()
    return np.fromfile(path, dtype=REC), step_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--save", default=None, help="also keep the raw records here (gemv_trace.py --load reads them)")
    ap.add_argument("--load", default=None, help="analyze saved records instead of running the engine")
    ap.add_argument("--bytes-per-weight", type=float, default=1.0, help="FP8: 1 (block scales not counted)")
    args = ap.parse_args()
    if args.load:
        recs, step_s = np.fromfile(args.load, dtype=REC), float("nan")
    else:
        recs, step_s = record(args)
    if args.save:
        recs.tofile(args.save)
    ls = launches(recs)
    print(f"{len(recs)} block records, {len(ls)} launches; decode step {step_s * 1e3:.3f} ms (traced build)")
    stats = defaultdict(lambda: defaultdict(list))
    groups = defaultdict(lambda: defaultdict(list))  # shape -> (row blocks, lead part, tail part) -> times
    prev_end, prev_key = None, "-"
    for L in ls:
        t = L["t"].astype(np.int64)
        t0 = t[:, 1].min()
        key = (int(L[0]["rows"]), int(L[0]["cols"]), int(L[0]["grid"]))
        s = stats[key]
        if prev_end is not None:
            s["release"].append((t0 - prev_end) / 1e3)
            s["prev"].append(prev_key)
        s["entry_first"].append((t[:, 0].min() - t0) / 1e3)
        s["entry_last"].append((t[:, 0].max() - t0) / 1e3)
        s["staged"].append(float(np.median(t[:, 2] - t[:, 1])) / 1e3)
        loop = (t[:, 3] - t0) / 1e3
        s["loop_first"].append(loop.min())
        s["loop_med"].append(float(np.median(loop)))
        s["loop_last"].append(loop.max())
        s["end"].append((t[:, 4].max() - t0) / 1e3)
        s["epi"].append(float(np.median(t[:, 4] - t[:, 3])) / 1e3)
        for p, loop_end, end in zip(L["parts"].tolist(), (t[:, 3] - t0) / 1e3, (t[:, 4] - t0) / 1e3):
            groups[key][(p & 0xFFFF, bool(p & 0x10000), bool(p & 0x20000))].append((loop_end, end))
        window = (t[:, 4].max() - (prev_end if prev_end is not None else t0)) / 1e3
        s["gbps"].append(key[0] * key[1] * args.bytes_per_weight / max(window, 1e-3) / 1e3)
        prev_end, prev_key = t[:, 4].max(), f"{key[0]}x{key[1]}"
    med = statistics.median
    print(f"{'rows x cols':>13} {'grid':>5} {'n':>4} {'prev':>11} {'release':>8} {'entry 1st/last':>15} "
          f"{'staged':>7} {'loop 1st / med / last':>22} {'end':>7} {'epi':>6} {'GB/s':>6}")  # fmt: skip
    order = sorted(stats, key=lambda k: -med(stats[k]["end"]) * len(stats[k]["end"]))
    for key in order:
        s = stats[key]
        prev = max(set(s["prev"]), key=s["prev"].count) if s["prev"] else "-"
        rel = med(s["release"]) if s["release"] else float("nan")
        print(f"{key[0]:>6}x{key[1]:<6} {key[2]:>5} {len(s['end']):>4} {prev:>11} {rel:>8.2f} "
              f"{med(s['entry_first']):>7.2f}/{med(s['entry_last']):<7.2f} {med(s['staged']):>7.2f} "
              f"{med(s['loop_first']):>6.2f} / {med(s['loop_med']):>6.2f} / {med(s['loop_last']):>6.2f} "
              f"{med(s['end']):>7.2f} {med(s['epi']):>6.2f} {med(s['gbps']):>6.0f}")  # fmt: skip

    for key in order:
        g = groups[key]
        if len({k[0] for k in g}) < 2:
            continue
        print(f"{key[0]}x{key[1]} grid {key[2]}, blocks by row blocks taken (lead / tail part):")
        for (nrb, lead, tail), v in sorted(g.items()):
            print(f"  {nrb} row blocks{' lead' if lead else ''}{' tail' if tail else ''}: {len(v) // len(stats[key]['end'])} "
                  f"blocks, loop end {med(x[0] for x in v):.2f}, end {med(x[1] for x in v):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
