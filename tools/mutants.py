#!/usr/bin/env python3
"""Planted bugs the test suite must catch: each mutant is applied alone to a scratch copy of the
tree, the CPU library and the C tests it needs are rebuilt incrementally, and only the tests
named for it run. A mutant that survives (its tests pass) is a gap in the suite.

    python tools/mutants.py                  # every mutant; prints caught / survived
    python tools/mutants.py --list           # the list, nothing run
    python tools/mutants.py -k stop          # mutants whose name contains "stop"
    python tools/mutants.py --check          # every original text still found once (no build)

The scratch copy lives in --scratch (default /tmp/pyengine-mutants): the working tree is copied
there file by file (only files whose bytes differ, so the build stays incremental between runs),
built once with -DPYENGINE_CUDA=OFF -DPYENGINE_TESTS=ON, and the named tests run on the unmutated
copy first (a failing test cannot catch anything). Test names: "tests/<file>.py::<test>" (pytest
node ids; a parametrized test without its [id] runs every case) or "ctest:<binary>[:<filter>]"
(a native/tests executable; the filter selects tests whose name contains it).

An original text that is no longer found exactly once (the file changed) is reported as stale:
update its entry.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Mutant:
    name: str
    edits: list[tuple[str, str, str]]  # (file, original text, replacement)
    tests: list[str]
    why: str = ""
    native: bool = field(init=False)

    def __post_init__(self):
        self.native = any(f.startswith("native/") for f, _, _ in self.edits)


def m(name, file, original, replacement, tests, why=""):
    return Mutant(name, [(file, original, replacement)], tests, why)


SCHED = "native/src/engine/scheduler.cpp"
NORM = "native/src/kernels/cpu/rms_norm.cpp"
MAX_BATCH = ("static_cast<int64_t>(running_.size()) >= p_.max_batch", "static_cast<int64_t>(running_.size()) > p_.max_batch")

MUTANTS: list[Mutant] = [
    # --- the gaps issue 46 names ---
    m("scheduler admits max_batch + 1", SCHED, *MAX_BATCH, ["ctest:test_scheduler:running_never_exceeds"],
      "a slot pool larger than max_batch leaves the limit to the scheduler"),
    Mutant("planner spare GDN slot + scheduler admits max_batch + 1",
           [("native/src/cache/planner.cpp", "p.gdn_slots = r.max_batch;", "p.gdn_slots = r.max_batch + 1;"),
            (SCHED, *MAX_BATCH)],
           ["tests/test_engine_scheduling.py::test_running_never_exceeds_max_batch"],
           "the engine ran 3 requests at once under max_batch=2"),
    m("stream drops text held for a stop string at the end", "pyengine/stream.py",
      "            elif finished:\n                text += self._stops.flush()\n", "",
      ["tests/test_stop_strings.py::test_text_held_for_a_stop_string_comes_out_when_generation_ends_by_length",
       "tests/test_server_openai.py::test_text_held_for_a_stop_string_is_sent_when_generation_ends_by_length"]),
    m("stop-string hold-back one character short", "pyengine/stop_strings.py",
      "for s in self.stop), default=1) - 1", "for s in self.stop), default=1) - 2",
      ["tests/test_stop_strings.py::test_random_splits_equal_whole_text_search"]),
    m("rms_norm drops eps", NORM, "static_cast<float>(dim) + eps);\n          if (offset) {",
      "static_cast<float>(dim));\n          if (offset) {", ["ctest:test_ops_norm:near_eps"]),
    m("chat template loses its keyword arguments (enable_thinking)", "pyengine/chat_template.py",
      "variables = {**self.special_tokens, **template_kwargs}", "variables = dict(self.special_tokens)",
      ["tests/test_checkpoint_tokenizer.py::test_template_renders_as_transformers_did"]),
    m("tokenizer strips the text it encodes", "pyengine/tokenizer.py",
      "self._tokenizer.encode(text, add_special_tokens", "self._tokenizer.encode(text.strip(), add_special_tokens",
      ["tests/test_checkpoint_tokenizer.py::test_tokenizer_gives_transformers_ids"]),
    # --- caught before issue 46, kept so they stay caught ---
    m("rope frequencies over head_dim instead of rot_dim", "native/src/kernels/cpu/rope.cpp",
      "static_cast<float>(2 * i) / static_cast<float>(rot_dim)", "static_cast<float>(2 * i) / static_cast<float>(head_dim)",
      ["ctest:test_ops_attention:rope"]),
    m("GDN decay sign", "native/src/kernels/cpu/gdn_recurrent.cpp",
      "g[t * n_heads + h] = -std::exp(A_log[h]) * sp;", "g[t * n_heads + h] = std::exp(A_log[h]) * sp;",
      ["ctest:test_ops_gdn:gdn_gates_values"]),
    m("attention scale 1/D instead of 1/sqrt(D) (model)", "native/src/model/qwen35_forward.cpp",
      "const float scale = 1.0f / std::sqrt(static_cast<float>(D));", "const float scale = 1.0f / static_cast<float>(D);",
      ["tests/test_model_goldens.py::test_prompt_logits_match_transformers[ckpt_text_bf16]"]),
    m("online softmax forgets to rescale the running sum", "native/src/kernels/cpu/attention.cpp",
      "l[v] = l[v] * corr + sum;", "l[v] = l[v] + sum;", ["ctest:test_ops_attention:attention"]),
    m("detokenizer emits incomplete UTF-8", "pyengine/tokenizer.py",
      ' or new_text.endswith("\\ufffd"):', ":", ["tests/test_tokenizer.py"]),
    # --- one per op family (and the caches, the sampler, conversions, the quantizer) ---
    m("attention: scores unscaled (op)", "native/src/kernels/cpu/attention.cpp",
      "? scale * res[r * 4 + c] :", "? res[r * 4 + c] :", ["ctest:test_ops_attention:attention"]),
    m("attention: accumulator not rescaled", "native/src/kernels/cpu/attention.cpp",
      "for (int64_t d = 0; d < D; ++d) av[d] *= corr;", "for (int64_t d = 0; d < D; ++d) av[d] *= 1.0f;",
      ["ctest:test_ops_attention:attention"]),
    m("attention (tiled): running sum not rescaled", "native/src/kernels/cpu/attention_tiled.cpp",
      "l[v] *= corr[v];", "l[v] *= 1.0f;", ["ctest:test_ops_attention:attention"]),
    m("attention (tiled): a query sees the next key", "native/src/kernels/cpu/attention_tiled.cpp",
      "(t0 + j - first_pos) * group);  // queries", "(t0 + j - first_pos - 1) * group);  // queries",
      ["ctest:test_ops_attention:attention"]),
    m("attention_inputs: q head norm without the +1 offset", "native/src/kernels/cpu/attention_inputs.cpp",
      "rms_norm(a.q, a.q_norm, T * a.Hq, D, a.eps, a.norm_offset, a.q);", "rms_norm(a.q, a.q_norm, T * a.Hq, D, a.eps, false, a.q);",
      ["ctest:test_ops_norm:attention_inputs"]),
    m("rms_norm_gated drops eps", NORM, "static_cast<float>(dim) + eps);\n          for (int64_t j = 0; j < dim; ++j) yr[j] =",
      "static_cast<float>(dim));\n          for (int64_t j = 0; j < dim; ++j) yr[j] =", ["ctest:test_ops_norm:near_eps"]),
    m("rms_norm_gated reads a strided z as dense rows", NORM, "z + (r / z_heads) * z_stride + (r % z_heads) * dim;",
      "z + r * dim;", ["ctest:test_ops_norm:strided_z"]),
    m("l2_norm drops eps", NORM, "scale / std::sqrt(sum_squares(xr, dim) + eps)", "scale / std::sqrt(sum_squares(xr, dim))",
      ["ctest:test_ops_norm:near_eps"]),
    m("swiglu: silu on the up half", "native/src/kernels/cpu/elementwise.cpp",
      "o[j] = silu(g[j]) * u[j];", "o[j] = silu(u[j]) * g[j];", ["ctest:test_ops_norm:swiglu"]),
    m("linear: 16-bit GEMV drops the first tail column", "native/src/kernels/cpu/linear.cpp",
      "for (int64_t jj = c16; jj < cols; ++jj) s += w16_to_f32<DT>(w[r][jj]) * x[t][jj];",
      "for (int64_t jj = c16 + 1; jj < cols; ++jj) s += w16_to_f32<DT>(w[r][jj]) * x[t][jj];",
      ["ctest:test_ops_linear:linear_every_dtype_awkward_sizes"]),
    m("embedding: FP8 block scale of the wrong row block", "native/src/kernels/cpu/embedding.cpp",
      "w.block_scale + (row / blk) * n_col_blocks", "w.block_scale + (r / blk) * n_col_blocks",
      ["ctest:test_ops_linear:embedding"]),
    m("conv1d without its silu", "native/src/kernels/cpu/conv1d.cpp",
      "o[c] = silu(acc[c]);", "o[c] = acc[c];", ["ctest:test_ops_gdn:conv1d"]),
    m("GDN step: beta scales v only", "native/src/kernels/cpu/gdn_step.h",
      "delta[j] = beta * (v[j] - kv_mem[j]);", "delta[j] = beta * v[j] - kv_mem[j];",
      ["ctest:test_ops_gdn:gdn_recurrent_vs_naive", "ctest:test_ops_gdn_decode:simple"]),
    m("GDN decode: value head h reads key head h % Hk", "native/src/kernels/cpu/gdn_decode.cpp",
      "h = task % Hv, kh = h / r;", "h = task % Hv, kh = h % Hk;", ["ctest:test_ops_gdn_decode:equals_per_sequence"]),
    m("GDN chunked: decay of A reversed", "native/src/kernels/cpu/gdn_chunked.cpp",
      "Ai[j] = b.bet[i] * std::exp(b.gam[i] - b.gam[j])", "Ai[j] = b.bet[i] * std::exp(b.gam[j] - b.gam[i])",
      ["ctest:test_ops_gdn:gdn_chunked_vs_recurrent"]),
    m("KV codec: int8 scale from 126", "native/src/kernels/cpu/kv_codec.cpp",
      "max_abs(src, D) / 127.0f", "max_abs(src, D) / 126.0f", ["ctest:test_kv_codec"]),
    m("sampler: repetition penalty raises negative logits", "native/src/kernels/cpu/sampling.cpp",
      "orig[j] > 0.0f ? orig[j] / rp : orig[j] * rp", "orig[j] / rp", ["ctest:test_ops_sampling:penalties"]),
    m("bf16 rounding: ties away from even", "native/src/core/dtype.cpp",
      "(u + 0x7fffu + ((u >> 16) & 1u)) >> 16", "(u + 0x8000u) >> 16", ["ctest:test_ops_dtype:bf16"]),
    m("int8 quantizer truncates", "native/src/model/quantize.cpp",
      "std::nearbyint(row[j] / s)", "std::trunc(row[j] / s)", ["ctest:test_quantize:quantize_i8_known_values"]),
    m("KV pool: a shared page keeps one reference", "native/src/cache/kv_pool.cpp",
      "  ++refs_[p];\n", "", ["ctest:test_scheduler:prefix_cache"]),
    m("GDN q scale left out (model)", "native/src/model/qwen35_forward.cpp",
      "1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)));", "1e-6f, 1.0f);",
      ["tests/test_model_goldens.py::test_prompt_logits_match_transformers[ckpt_text_bf16]"]),
    # --- the DFlash draft ---
    m("draft block attention causal", "native/src/model/backend.cpp",
      "attention_paged(qp + b * block, 1, starts[b] + n_q - 1,", "attention_paged(qp + b * block, 1, starts[b],",
      ["ctest:test_backend_ops:attention_blocks", "tests/test_dflash_engine.py::test_draft_matches_the_reference_from_its_features"]),
    m("draft block attention's q permutation pairs a query with the wrong KV head", "native/src/model/backend.cpp",
      "natural = (b * n_q + i) * n_kv_heads + g;", "natural = (b * n_q + i) * n_kv_heads + (n_kv_heads - 1 - g);",
      ["ctest:test_backend_ops:attention_blocks"]),
    m("draft context features gathered in reverse target-layer order", "native/src/model/dflash_forward.cpp",
      "const int64_t id = (off + j * s.layer_stride + t * s.row_stride) / H;",
      "const int64_t id = (off + (F - 1 - j) * s.layer_stride + t * s.row_stride) / H;",
      ["ctest:test_dflash:batched_sequences_equal_each_alone"],
      "several sequences' features (token- or layer-major) take the gather, one sequence's token-major ones do not"),
    m("draft context rows from 0 every step", "native/src/model/dflash_forward.cpp",
      "const int64_t p0 = block ? s.n_context + s.n_new : s.n_context, len = block ? bs : s.n_new;",
      "const int64_t p0 = block ? s.n_context + s.n_new : 0, len = block ? bs : s.n_new;",
      ["tests/test_dflash_engine.py::test_context_in_pieces_equals_one_call"]),
    m("target features one layer early (hidden_states[l] for hidden_states[l + 1])", "native/src/model/qwen35_forward.cpp",
      "keep_rows(b.keep_hidden, static_cast<int32_t>(li), r.x);", "keep_rows(b.keep_hidden, static_cast<int32_t>(li) + 1, r.x);",
      ["tests/test_dflash_engine.py::test_target_features_match_transformers"]),
    m("greedy verify accepts a draft that differs from its row's argmax", "native/src/engine/engine_spec.cpp",
      "r.drafts[static_cast<size_t>(a)] == samples_[job + a].token", "r.drafts[static_cast<size_t>(a)] != samples_[job + a].token",
      ["tests/test_speculative.py::test_test_checkpoint_spec_equals_plain_at_temperature_0"]),
    m("a chained verify call writes the state back to the slot it read", "native/src/model/qwen35_forward.cpp",
      "out.insert(out.end(), written[i].begin(), written[i].end());\n      out.push_back(s.gdn_slot);",
      "out.push_back(s.gdn_slot);\n      out.insert(out.end(), written[i].begin(), written[i].end());",
      ["tests/test_speculative.py::test_test_checkpoint_spec_equals_plain_at_temperature_0"]),
    m("a verify chunk's further snapshot at an inside offset (a prefix-cache block boundary) is not copied",
      "native/src/model/qwen35_forward.cpp",
      "for (const auto& [dst, src] : step_.chain_copies) gdn.copy(dst, src);",
      "for (const auto& [dst, src] : step_.chain_copies) (void)dst, (void)src;",
      ["tests/test_speculative.py::test_default_model_spec_equals_plain_at_temperature_0"]),
    m("step-cost model without the ridge on its per-step prefill cost", "native/src/engine/step_cost.h",
      "kStepRidge = 0.02;", "kStepRidge = 0.0;",
      ["ctest:test_step_cost:one_prefill_size_counts_per_token"],
      "an H100's 27B long prefill fitted 52 ms a step, 0 a token: the pacer kept full chunks"),
    m("pacer leaves a step's rows in the slow matmul gap", "native/src/engine/step_pacer.cpp",
      "rows > slow_.first && rows < slow_.second", "false && rows > slow_.first",
      ["ctest:test_step_cost:fit_grows_a_slice_out_of_the_slow_rows_gap"],
      "slices beside decode rows ran the mma.sync GEMM: steps of 580 ms under a 60 ms limit"),
    m("pacer keeps a last GEMM row tile however little of it the step fills", "native/src/engine/step_pacer.cpp",
      "part < static_cast<int64_t>(kMinTileFill * static_cast<double>(tile_))",
      "part < static_cast<int64_t>(0.0 * static_cast<double>(tile_))",
      ["ctest:test_step_cost:fit_drops_a_last_row_tile"],
      "a 512-token chunk beside one decode row took 75.9 ms against 61.2 alone on the 27B (an extra tile)"),
    m("the MTP chain on the device feeds every sequence the first one's draft", "native/src/engine/mtp_proposer.cpp",
      "cb.token_from_sample.push_back(static_cast<int32_t>(i));", "cb.token_from_sample.push_back(0);",
      ["tests/test_speculative.py::test_default_model_spec_equals_plain_at_temperature_0"]),
    m("pacer fits steps to a fixed limit without headroom for recent overruns", "native/src/engine/step_pacer.cpp",
      "max_step_s_ > 0.0 ? limit_s / headroom_ : limit_s;", "limit_s;",
      ["ctest:test_step_cost:a_fixed_limit_keeps_headroom_for_the_overrun"],
      "27B on an H100 at max_step_ms 60: ITL p99 60.2 / 61.2 ms"),
]


def run(cmd, cwd, env=None, timeout=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tree_files() -> list[str]:
    out = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], ROOT).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def sync(scratch: Path) -> int:
    """Copies the working tree into scratch/src, only files whose bytes differ. Returns how many."""
    n = 0
    for rel in tree_files():
        src, dst = ROOT / rel, scratch / "src" / rel
        data = src.read_bytes()
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        n += 1
    return n


class Scratch:
    def __init__(self, path: Path, jobs: int):
        self.path, self.src, self.build, self.jobs = path, path / "src", path / "build", jobs
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYENGINE_LIBRARY", "PYTHONPATH")}
        self.env["PYTHONPATH"] = str(self.src)

    def configure(self):
        if (self.build / "build.ninja").exists():
            return
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        r = run(["cmake", "-S", str(self.src), "-B", str(self.build), *gen, "-DPYENGINE_CUDA=OFF",
                 "-DPYENGINE_TESTS=ON", "-DCMAKE_BUILD_TYPE=Release"], self.src)  # fmt: skip
        if r.returncode:
            sys.exit("cmake failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])

    def build_for(self, tests: list[str]) -> str | None:
        """Brings the library and the named C tests up to date; the error text if it fails."""
        targets = sorted({"pyengine"} | {t.split(":")[1] for t in tests if t.startswith("ctest:")})
        r = run(["nice", "cmake", "--build", str(self.build), "-j", str(self.jobs), "--target", *targets], self.src)
        if r.returncode:
            return (r.stdout + r.stderr)[-3000:]
        shutil.copyfile(self.build / "libpyengine.so", self.src / "pyengine" / "libpyengine.so")
        return None

    def run_tests(self, tests: list[str], timeout: float) -> tuple[bool, str]:
        """(all passed, the first failure's output tail). C tests first: they are the quickest."""
        for t in (t for t in tests if t.startswith("ctest:")):
            _, binary, *flt = t.split(":")
            try:
                r = run(["nice", str(self.build / binary), *flt], self.src, self.env, timeout)
            except subprocess.TimeoutExpired:
                return False, f"{t}: timed out after {timeout:.0f} s"
            if r.returncode or "0/0 tests passed" in r.stdout:
                return False, f"{t}:\n{r.stdout[-1500:]}{r.stderr[-500:]}"
        py = [t for t in tests if not t.startswith("ctest:")]
        if py:
            cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *py]
            try:
                r = run(["nice", *cmd], self.src, self.env, timeout)
            except subprocess.TimeoutExpired:
                return False, f"pytest: timed out after {timeout:.0f} s"
            if r.returncode:
                return False, r.stdout[-2000:] + r.stderr[-500:]
        return True, ""


def check_originals(mutants: list[Mutant], root: Path) -> list[str]:
    problems = []
    for mu in mutants:
        for f, orig, _ in mu.edits:
            path = root / f
            if not path.is_file() or path.read_text().count(orig) != 1:
                n = path.read_text().count(orig) if path.is_file() else "no file"
                problems.append(f"{mu.name}: {f}: original found {n} times, not once")
    return problems


def apply(mu: Mutant, src: Path) -> dict[Path, str]:
    """Applies the edits in src; returns each touched file's original text."""
    saved: dict[Path, str] = {}
    for f, orig, new in mu.edits:
        path = src / f
        text = path.read_text()
        saved.setdefault(path, text)
        path.write_text(text.replace(orig, new, 1))
    return saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--check", action="store_true", help="check every original text is found once and exit")
    ap.add_argument("-k", dest="select", help="only mutants whose name contains this (case-insensitive)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/pyengine-mutants"))
    ap.add_argument("--jobs", type=int, default=2, help="build jobs (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each catching test's output tail")
    args = ap.parse_args()

    mutants = [mu for mu in MUTANTS if not args.select or args.select.lower() in mu.name.lower()]
    if args.list:
        for mu in mutants:
            files = ", ".join(sorted({f for f, _, _ in mu.edits}))
            print(f"{mu.name}\n    {files}\n    tests: {', '.join(mu.tests)}")
        return 0
    problems = check_originals(mutants, ROOT)
    if args.check or problems:
        print("\n".join(problems) or f"all {len(mutants)} mutants' originals found once")
        return 1 if problems else 0

    t0 = time.monotonic()
    scratch = Scratch(args.scratch, args.jobs)
    print(f"scratch {args.scratch}: {sync(args.scratch)} files copied", flush=True)
    scratch.configure()
    all_tests = list(dict.fromkeys(t for mu in mutants for t in mu.tests))
    err = scratch.build_for(all_tests)
    if err:
        sys.exit("the unmutated tree does not build:\n" + err)
    ok, out = scratch.run_tests(all_tests, args.timeout * 2)
    if not ok:
        sys.exit("the unmutated tree fails the mutants' tests (fix that first):\n" + out)
    print(f"unmutated tree passes the {len(all_tests)} tests ({time.monotonic() - t0:.0f} s)", flush=True)

    results = []
    for i, mu in enumerate(mutants, 1):
        t1 = time.monotonic()
        saved = apply(mu, scratch.src)
        try:
            err = scratch.build_for(mu.tests) if mu.native else None
            if err:
                verdict, out = "BUILD FAILED", err
            else:
                passed, out = scratch.run_tests(mu.tests, args.timeout)
                verdict = "SURVIVED" if passed else "caught"
        finally:
            for path, text in saved.items():
                path.write_text(text)
        results.append((mu, verdict))
        print(f"[{i:2d}/{len(mutants)}] {verdict:8s} {mu.name} ({time.monotonic() - t1:.0f} s)", flush=True)
        if args.verbose and out:
            print("    " + out.strip().replace("\n", "\n    ")[-1200:])
    caught = sum(v == "caught" for _, v in results)
    print(f"\n{caught} caught, {sum(v == 'SURVIVED' for _, v in results)} survived, "
          f"{sum(v == 'BUILD FAILED' for _, v in results)} did not build, of {len(results)} "
          f"({time.monotonic() - t0:.0f} s)")
    for mu, v in results:
        if v != "caught":
            print(f"  {v}: {mu.name} ({', '.join(mu.tests)})")
    scratch.build_for(all_tests)  # leave the scratch build unmutated
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
