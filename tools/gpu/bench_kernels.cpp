// Micro-benchmark of the CUDA decode/prefill kernels on the 27B shape (MODEL_SPEC §1), against
// the device-to-device copy bandwidth measured in the same run (METHOD.md: the two numbers).
// Prints one line per case: time (median of 20, CUDA events, after warm-up; section 2 as device
// time per call from a CUDA graph of several calls, the eager time beside it), bytes moved, GB/s
// and the fraction of the copy bandwidth (memory-bound kernels) or TFLOP/s (GEMM).
// Weights are random bytes (fp8 kept finite), rotated over copies larger than L2.
// Build: the CMake target bench_kernels (CUDA build with PYENGINE_TESTS).
// Usage: bench_kernels [--quick] [--only gemv|attn|attn_prefill|gemm|norm|pattern] (--only gemv:
// sections 1-2 and 2b (the verify step's 16 / 32 tokens, bench_kernels_verify.cpp) alone, a short
// device call; --only attn: the decode attention, then the prefill attention's variants;
// --only attn_prefill: those alone; --only norm: the decode-row norms warm and behind an
// L2-flushing memset; --only pattern: the GEMV's weight-load order alone, bench_patterns.cu;
// --only verify_gdn: a verify step's GDN core, gdn_chain against chained gdn_decode calls.)
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_kernels.h"
#include "kernels/cuda/cuda_ops.h"

using namespace pe;

// tools/gpu/bench_patterns.cu
bool launch_weight_pattern(int kind, const void* w, int64_t rows, int64_t cols, int blocks_per_sm, uint32_t* sink,
                           cudaStream_t stream);

// Device time per call of fn (k calls captured into one CUDA graph on a stream, median of
// g_reps replays / k): no host launch cost, as the model runs its decode step.
float graph_ms(const std::function<void(int, cudaStream_t)>& fn, int k) {
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  fn(0, st);  // warm-up (first-call setup outside the capture)
  CK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < k; ++i) fn(i, st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = time_ms([&](int) { CK(cudaGraphLaunch(exec, st)); });  // st syncs with the legacy stream
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
  return ms / k;
}

int g_reps = 20;

float time_ms(const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < g_reps; ++i) {
    CK(cudaEventRecord(a));
    fn(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void* dalloc(size_t bytes, uint8_t fill_seed) {
  void* p;
  CK(cudaMalloc(&p, bytes));
  // Not zeros (METHOD.md): a byte pattern; for fp8 0x00..0x7e/0x80..0xfe are finite values.
  std::vector<uint8_t> h(1 << 20);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>((i * 131 + fill_seed) % 251) & 0xbf;
  for (size_t off = 0; off < bytes; off += h.size())
    CK(cudaMemcpy(static_cast<char*>(p) + off, h.data(), std::min(h.size(), bytes - off), cudaMemcpyHostToDevice));
  return p;
}

double g_copy_gbs = 0;

void report(const char* name, float ms, double bytes, double flops) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-44s %9.4f ms %10.1f MB %8.0f GB/s %6.1f%% of copy", name, ms, bytes / 1e6, gbs,
              100.0 * gbs / g_copy_gbs);
  if (flops > 0) std::printf("  %7.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  std::printf("\n");
}

// name contains one of the '|'-separated parts of filter (PE_BENCH_GEMV_FILTER="a|b"; none: all).
bool name_selected(const char* name, const char* filter) {
  const std::string f = std::string(filter ? filter : "") + "|";
  for (size_t a = 0, b; (b = f.find('|', a)) != std::string::npos; a = b + 1)
    if (b > a && std::strstr(name, f.substr(a, b - a).c_str())) return true;
  return f == "|";
}

int main(int argc, char** argv) {
  bool quick = false, only_gemv = false, only_attn = false, only_attn_prefill = false, only_gemm = false, only_norm = false, only_pattern = false;
  bool only_verify_gdn = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "gemv") == 0) only_gemv = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "attn") == 0) only_attn = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "attn_prefill") == 0) only_attn_prefill = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "gemm") == 0) only_gemm = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "norm") == 0) only_norm = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "pattern") == 0) only_pattern = true, ++i;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "verify_gdn") == 0) only_verify_gdn = true, ++i;
    else { std::printf("usage: bench_kernels [--quick] [--only gemv|attn|attn_prefill|gemm|norm|pattern|verify_gdn]\n"); return 2; }
  }
  if (quick) g_reps = 5;
  if (!cuda::device_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s sm_%d%d, %d SMs, L2 %d MB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  // 1. Copy bandwidth (bytes read + written).
  const size_t copy_bytes = size_t(2) << 30;
  void* src = dalloc(copy_bytes, 1);
  void* dst = dalloc(copy_bytes, 2);
  const float copy_ms = time_ms([&](int) { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  g_copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("%-44s %9.4f ms  copy bandwidth %.0f GB/s (read + write)\n", "d2d copy 2 GiB", copy_ms, g_copy_gbs);
  CK(cudaFree(dst));
  if (only_verify_gdn) {
    bench_verify_gdn();
    CK(cudaDeviceSynchronize());
    std::printf("bench done\n");
    return 0;
  }
  if (only_attn_prefill) {
    bench_prefill_attention(quick, false);
    CK(cudaDeviceSynchronize());
    std::printf("bench done\n");
    return 0;
  }
  if (only_norm) {
    // add_rms_norm / rms_norm on decode-sized rows (27B hidden 5120): warm (back to back) and
    // behind a 256 MB memset per call, as in a decode step where each norm follows ~190 MB of
    // weights through L2 (code and data cold): that time minus the memset alone. ncu measured
    // add_rms_norm at 17.9 us per call inside the 27B decode step.
    const int64_t dim = 5120;
    float* nx = static_cast<float*>(dalloc(size_t(8) * dim * 4, 0));
    float* nr = static_cast<float*>(dalloc(size_t(8) * dim * 4, 0));
    float* nw = static_cast<float*>(dalloc(size_t(dim) * 4, 0));
    float* ny = static_cast<float*>(dalloc(size_t(8) * dim * 4, 0));
    CK(cudaMemset(nx, 0, size_t(8) * dim * 4));
    CK(cudaMemset(nr, 0, size_t(8) * dim * 4));
    CK(cudaMemset(nw, 0, size_t(dim) * 4));
    const size_t thrash_bytes = size_t(256) << 20;
    void* thrash = dalloc(thrash_bytes, 5);
    const float memset_ms = graph_ms([&](int, cudaStream_t st) { CK(cudaMemsetAsync(thrash, 1, thrash_bytes, st)); }, 8);
    for (int64_t rows : {1, 8})
      for (int add = 1; add >= 0; --add) {
        auto norm = [&](cudaStream_t st) {
          if (add) cuda::add_rms_norm(nx, nr, nw, rows, dim, 1e-6f, true, ny, st);
          else cuda::rms_norm(nx, nw, rows, dim, 1e-6f, true, ny, st);
        };
        const float warm = graph_ms([&](int, cudaStream_t st) { norm(st); }, 16);
        const float cold = graph_ms([&](int, cudaStream_t st) {
          CK(cudaMemsetAsync(thrash, 1, thrash_bytes, st));
          norm(st);
        }, 8) - memset_ms;
        std::printf("%s %lld x %lld: warm %.2f us, after a 256 MB memset %.2f us\n",
                    add ? "add_rms_norm" : "rms_norm", (long long)rows, (long long)dim, warm * 1e3, cold * 1e3);
      }
    std::printf("bench done\n");
    return 0;
  }
  const size_t pool_bytes = size_t(6) << 30;  // weight copies rotate through it (L2 is ~50 MB)
  void* pool = dalloc(pool_bytes, 9);
  if (only_pattern) {
    // The FP8 GEMV's weight reads alone (no decode, no mma), by pattern and blocks per SM
    // (bench_patterns.cu): bytes = the matrix.
    struct PShape { const char* name; int64_t rows, cols; };
    const PShape pshapes[] = {{"gate|up 34816x5120", 34816, 5120}, {"qkv|z|a|b 16480x5120", 16480, 5120},
                              {"out_proj 5120x6144", 5120, 6144}, {"down 5120x17408", 5120, 17408}};
    const char* kinds[] = {"gemv T=4", "gemv T=1", "contiguous", "tiled T=4", "tiled T=1"};
    uint32_t* sink = static_cast<uint32_t*>(dalloc(size_t(34816 / 8) * 256 * 4, 0));
    for (const PShape& s : pshapes) {
      const size_t bytes = static_cast<size_t>(s.rows * s.cols);
      const int copies = static_cast<int>(std::min<size_t>(pool_bytes / bytes, 8));
      for (int kind = 0; kind < 5; ++kind)
        for (int bps : {2, 3, 4}) {
          const float ms = graph_ms([&](int i, cudaStream_t st) {
            const void* w = static_cast<const char*>(pool) + (i % copies) * bytes;
            if (!launch_weight_pattern(kind, w, s.rows, s.cols, bps, sink, st)) std::exit(1);
          }, 8);
          CK(cudaGetLastError());
          char name[96];
          std::snprintf(name, sizeof(name), "pattern %s %s %d/SM", s.name, kinds[kind], bps);
          report(name, ms, static_cast<double>(bytes));
        }
    }
    std::printf("bench done\n");
    return 0;
  }

  // 2. Decode GEMV on the 27B layer shapes (MODEL_SPEC), every weight format; weights rotate over
  // the pool (> L2). Bytes = weights + their scales + x + out.
  struct Shape { const char* name; int64_t rows, cols; };
  const Shape shapes[] = {{"gdn in_proj qkv|z|a|b 16480x5120", 16480, 5120}, {"attn q|k|v 14336x5120", 14336, 5120},
                          {"gdn in_proj_qkv 10240x5120", 10240, 5120}, {"gdn in_proj_z 6144x5120", 6144, 5120},
                          {"gdn out_proj|o_proj 5120x6144", 5120, 6144}, {"mlp gate|up 34816x5120", 34816, 5120},
                          {"mlp down 5120x17408", 5120, 17408},        {"attn q_proj 12288x5120", 12288, 5120},
                          {"attn k|v_proj 1024x5120", 1024, 5120},     {"gdn in_proj_a|b 48x5120", 48, 5120},
                          {"lm_head 248320x5120 (bf16)", 248320, 5120},
                          {"fp8 steady 278528x5120", 278528, 5120}};  // FP8 only: 8x gate|up, no ramp / tail
  const char* gemv_filter = std::getenv("PE_BENCH_GEMV_FILTER");
  float* x = static_cast<float*>(dalloc(size_t(4096) * 17408 * 4, 3));
  CK(cudaMemset(x, 0, 16));
  // x as small finite floats: overwrite with a pattern through a host copy
  {
    std::vector<float> hx(size_t(4096) * 17408);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  }
  float* out = static_cast<float*>(dalloc(size_t(4096) * 248320 * 4 / 8, 4));
  std::vector<float> hscale(size_t(2000) * 136, 0.01f);
  float* scale;
  CK(cudaMalloc(&scale, hscale.size() * 4));
  CK(cudaMemcpy(scale, hscale.data(), hscale.size() * 4, cudaMemcpyHostToDevice));
  // NVFP4 group scales (e4m3 1.0) for the largest non-lm_head shape.
  void* gscale = dalloc(size_t(34816) * 5120 / 16, 0);
  CK(cudaMemset(gscale, 0x38, size_t(34816) * 5120 / 16));
  for (DType dt : {DType::FP8_E4M3, DType::BF16, DType::I8, DType::NVFP4}) {
    if (only_attn || only_gemm) break;  // --only attn: section 4 alone; --only gemm: section 3
    for (const Shape& s : shapes) {
      const bool lm = s.rows == 248320;
      if (s.rows == 278528 && dt != DType::FP8_E4M3) continue;
      if (lm && dt != DType::BF16) continue;
      const size_t wbytes = dtype_bytes_for(dt, s.rows * s.cols);
      const double sbytes = dt == DType::FP8_E4M3 ? 4.0 * ((s.rows + 127) / 128) * ((s.cols + 127) / 128)
                            : dt == DType::I8     ? 4.0 * s.rows
                            : dt == DType::NVFP4  ? s.rows * s.cols / 16.0
                                                  : 0.0;
      const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(pool_bytes / wbytes, 8)));
      for (int n : {1, 2, 4, 8}) {
        if (quick && n == 2) continue;
        WeightView w = bench_weight(dt, s.rows, s.cols, nullptr, scale, gscale);
        // Quantized at n = 1 and 8: the GEMV tunings side by side (cuda::GemvTuning; "dflt" the
        // default, "regx" x in registers, "nocvt" FP8 by integer ops, not cvt (sm_89+), "T2" 16
        // rows per warp, "mb3" the staged kernels at 3 blocks per SM (slower for FP8, faster on
        // some I8 shapes), "nopdl" without programmatic dependent launch, "nosk" one
        // whole row block per block (no stream-K), "sk1" stream-K wherever the row blocks leave
        // slots empty, "bal" stream-K over several waves too (stream_k_balance_pct 100), "roll" /
        // "noroll" roll 2 / 0, "nopre" preload 0. Why the defaults: tools/gpu/KERNELS.md.
        const bool ab = (dt == DType::FP8_E4M3 || dt == DType::I8 || dt == DType::NVFP4) && (n == 1 || n == 8);
        const cuda::GemvTuning dflt;
        std::vector<std::pair<std::string, cuda::GemvTuning>> tunings = {{"", dflt}};
        if (ab) {
          auto with = [&](const char* name, auto edit) {
            cuda::GemvTuning t = dflt;
            edit(t);
            tunings.emplace_back(name, t);
          };
          tunings[0].first = " dflt";
          with(" regx", [](cuda::GemvTuning& t) { t.staged_x_max_bytes = 0; });
          if (dt == DType::FP8_E4M3) with(" nocvt", [](cuda::GemvTuning& t) { t.fp8_cvt = false; });
          with(" T2", [](cuda::GemvTuning& t) { t.rows_per_warp = 2; });
          with(" mb3", [](cuda::GemvTuning& t) { t.min_blocks = 3; });
          with(" nopdl", [](cuda::GemvTuning& t) { t.pdl = false; });
          with(" nosk", [](cuda::GemvTuning& t) { t.stream_k = false; });
          with(" sk1", [](cuda::GemvTuning& t) { t.stream_k_min_steps = 1; });
          with(" bal", [](cuda::GemvTuning& t) { t.stream_k_balance_pct = 100; });
          with(" roll", [](cuda::GemvTuning& t) { t.roll = 2; });
          with(" noroll", [](cuda::GemvTuning& t) { t.roll = 0; });
          with(" nopre", [](cuda::GemvTuning& t) { t.preload = 0; });
        }
        // " tileR": each tuning again on the weight in the GEMV tile layout of R rows, the R the
        // model gives this shape (cuda_ops.h, gemv_tile_rows: the model's layout; random bytes
        // either way). T2 is left out there: a tiled weight's R fixes T.
        std::vector<int> tiles(tunings.size(), 0);
        WeightView shape_only;
        shape_only.dtype = dt;
        shape_only.rows = s.rows;
        shape_only.cols = s.cols;
        const int tile = ab ? cuda::gemv_tile_rows(shape_only) : 0;
        if (tile != 0 && s.rows % tile == 0) {  // whole tiles: the pool copies hold rows x cols
          const size_t plain = tunings.size();
          for (size_t i = 0; i < plain; ++i) {
            if (tunings[i].first == " T2") continue;
            tunings.emplace_back(tunings[i].first + " tile" + std::to_string(tile), tunings[i].second);
            tiles.push_back(tile);
          }
        }
        for (size_t ti = 0; ti < tunings.size(); ++ti) {
          const auto& tuning = tunings[ti];
          char name[112];
          std::snprintf(name, sizeof name, "gemv %s %s n=%d%s", dtype_name(dt), s.name, n, tuning.first.c_str());
          if (!name_selected(name, gemv_filter)) continue;
          w.tile = tiles[ti];
          cuda::linear_gemv_set_tuning(tuning.second);
          // Eager (one launch between events: host launch cost included) and graph (device time).
          const float ms_eager = time_ms([&](int i) {
            w.data = static_cast<char*>(pool) + (i % copies) * wbytes;
            cuda::linear(x, n, w, out, nullptr);
          });
          const float ms = graph_ms([&](int i, cudaStream_t st) {
            w.data = static_cast<char*>(pool) + (i % copies) * wbytes;
            cuda::linear(x, n, w, out, st);
          }, 16);
          report(name, ms, double(wbytes) + sbytes + 4.0 * n * (s.cols + s.rows));
          std::printf("    (eager, launch cost included: %.4f ms)\n", ms_eager);
        }
        cuda::linear_gemv_set_tuning(dflt);
      }
    }
  }
  if (!only_attn && !only_gemm) bench_verify_gemv(x, out, pool, pool_bytes, scale, gscale, gemv_filter);
  if (only_gemv) {
    CK(cudaDeviceSynchronize());
    std::printf("bench done\n");
    return 0;
  }
  // 3. Prefill GEMM (bench_kernels_gemm.cpp).
  if (!only_attn) bench_prefill_gemm(x, pool, scale, gscale);
  if (only_gemm) {
    CK(cudaDeviceSynchronize());
    std::printf("bench done\n");
    return 0;
  }
  // 4. Attention decode at depth (27B: 24 q heads, 4 kv heads, D 256), batch 1, one layer, every
  // cache dtype; F16/FP8/I8/NVFP4 once per variant of the tensor-core kernel (cuda_ops.h). Bytes = K + V values + scales; caches rotate over copies of >= 256 MiB in all so
  // the reads come from HBM, not L2.
  for (DType kvt : {DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4, DType::F32})
    for (int64_t depth : {1024, 8192, 32768, 65536}) {
      const int64_t page = 16, n_pages = (depth + 1 + page - 1) / page, rows = n_pages * page * 4;
      const size_t vb = kvt == DType::NVFP4 ? 128 : 256 * dtype_size(kvt);  // value bytes per row
      const size_t sc = kvt == DType::I8 ? 1 : kvt == DType::NVFP4 ? 16 : 0;   // scales per row
      const size_t cache = size_t(rows) * vb, scales = size_t(rows) * sc * 4;
      const int copies = static_cast<int>(std::clamp<size_t>((size_t(256) << 20) / (2 * (cache + scales)) + 1, 1, 64));
      char* kc = static_cast<char*>(dalloc(cache * copies, 5));
      char* vc = static_cast<char*>(dalloc(cache * copies, 6));
      char *ks = nullptr, *vs = nullptr;
      if (kvt == DType::F32) {  // finite floats
        CK(cudaMemset(kc, 0x3c, cache * copies));
        CK(cudaMemset(vc, 0x3c, cache * copies));
      }
      if (scales) {
        CK(cudaMalloc(&ks, scales * copies));
        CK(cudaMalloc(&vs, scales * copies));
        CK(cudaMemset(ks, 0x3c, scales * copies));  // 0.0115f
        CK(cudaMemset(vs, 0x3c, scales * copies));
      }
      std::vector<int32_t> hpt(n_pages);
      for (int64_t i = 0; i < n_pages; ++i) hpt[i] = static_cast<int32_t>((i * 7) % n_pages);
      int32_t* pt;
      CK(cudaMalloc(&pt, n_pages * 4));
      CK(cudaMemcpy(pt, hpt.data(), n_pages * 4, cudaMemcpyHostToDevice));
      const size_t sb = cuda::attention_paged_scratch_bytes(1, depth, 24, 4, 256);
      void* scr;
      CK(cudaMalloc(&scr, std::max<size_t>(sb, 1)));
      // The tensor-core dtypes once per attention_decode_set_variant (cuda_ops.h; "dflt" = -1, the
      // per-dtype default), on the same buffers. Device time per call from a graph of one call per
      // copy (>= 256 MiB a replay: from HBM; as the model's step runs, launches queued ahead) and,
      // beside it, the eager time between two events (host launch cost included: most of the 1K
      // figure), whose calls walk on through the copies across the variants (no L2 hits).
      const bool tc = kvt != DType::BF16 && kvt != DType::F32;
      int next = 0;
      // Then, to 8K, the split length A/B (attention_decode_set_min_split_keys; "msk=N") for the
      // variants 0, 1 and 2.
      for (int msk : {0, 16, 64, 128})
      for (int variant = -1; variant < (tc ? cuda::kAttentionDecodeVariants : 0); ++variant) {
        if (variant == 2 && kvt != DType::NVFP4) continue;  // 2 differs from 1 for NVFP4 only
        if (msk && (!tc || depth > 8192 || variant == -1 || variant == 3)) continue;
        cuda::attention_decode_set_variant(variant);
        cuda::attention_decode_set_min_split_keys(msk);
        const auto call = [&](int c, cudaStream_t st) {
          cpu::PagedKV kv{kvt, kc + c * cache, vc + c * cache,
                          scales ? reinterpret_cast<float*>(ks + c * scales) : nullptr,
                          scales ? reinterpret_cast<float*>(vs + c * scales) : nullptr, page, 4, 256};
          cuda::attention_paged(x, 1, depth, 24, kv, pt, 0.0625f, x + 8192, out, scr, sb, st);
        };
        const float ms = graph_ms([&](int i, cudaStream_t st) { call(i % copies, st); }, std::max(copies, 8));
        const float ms_eager = time_ms([&](int) { call(next++ % copies, nullptr); });
        char name[112], var[24] = "";
        if (tc) std::snprintf(var, sizeof var, variant < 0 ? " dflt" : " v%d", variant);
        if (msk) std::snprintf(var + std::strlen(var), sizeof var - std::strlen(var), " msk=%d", msk);
        std::snprintf(name, sizeof name, "attn decode %s depth=%lld%s (%.1f us)", dtype_name(kvt), (long long)depth,
                      var, ms * 1e3);
        report(name, ms, 2.0 * (depth + 1) * 4 * (vb + 4.0 * sc));
        std::printf("    (eager, launch cost included: %.1f us)\n", ms_eager * 1e3);
      }
      cuda::attention_decode_set_variant(-1);
      cuda::attention_decode_set_min_split_keys(0);
      CK(cudaFree(kc)); CK(cudaFree(vc)); CK(cudaFree(pt)); CK(cudaFree(scr));
      if (ks) { CK(cudaFree(ks)); CK(cudaFree(vs)); }
    }
  if (only_attn) {
    bench_prefill_attention(quick, false);  // section 6 without the SIMT kernel
    CK(cudaDeviceSynchronize());
    std::printf("bench done\n");
    return 0;
  }
  // 5. GDN: decode step (state read + written) and chunked prefill of 4096 tokens, 27B shape.
  {
    const int64_t Hk = 16, Hv = 48, dk = 128, dv = 128;
    float* state;
    CK(cudaMalloc(&state, Hv * dk * dv * 4));
    CK(cudaMemset(state, 0, Hv * dk * dv * 4));
    float* gb;  // g, beta: small negative g, beta 0.5
    const int64_t n = quick ? 1024 : 4096;
    std::vector<float> hgb(2 * n * Hv);
    for (int64_t i = 0; i < n * Hv; ++i) { hgb[i] = -0.05f; hgb[n * Hv + i] = 0.5f; }
    CK(cudaMalloc(&gb, hgb.size() * 4));
    CK(cudaMemcpy(gb, hgb.data(), hgb.size() * 4, cudaMemcpyHostToDevice));
    const int64_t qk_stride = 2 * Hk * dk + Hv * dv;  // q | k | v slices of the conv output
    cpu::GdnArgs a{x, x + Hk * dk, qk_stride, x + 2 * Hk * dk, qk_stride, gb, gb + n * Hv, 1, Hk, Hv, dk, dv, state, out};
    float ms = time_ms([&](int) { cuda::gdn_recurrent(a, nullptr); });
    report("gdn_recurrent decode 27B (state r+w)", ms, 2.0 * Hv * dk * dv * 4);
    // Chunked prefill at 1024 and n tokens (scratch passed, as the model does). FLOPs as computed:
    // per token and value head the two 64-wide Gram products (Q K^T, K K^T), Q S, K S and the state
    // update (dk x dv each), T' Y and P V' (64 x dv each).
    const std::vector<int64_t> sizes = n == 1024 ? std::vector<int64_t>{n} : std::vector<int64_t>{1024, n};
    for (const int64_t nc : sizes) {
      a.n = nc;
      const size_t sb = cuda::gdn_chunked_scratch_bytes(nc, Hv);
      void* scr;
      CK(cudaMalloc(&scr, sb));
      ms = time_ms([&](int) { cuda::gdn_chunked(a, scr, sb, nullptr); });
      char name[96];
      std::snprintf(name, sizeof name, "gdn_chunked n=%lld 27B (%.0f tok/s/layer)", (long long)nc, nc / (ms * 1e-3));
      const double flops = 2.0 * nc * Hv * (2 * 64 * dk + 3 * dk * dv + 2 * 64 * dv);
      report(name, ms, 4.0 * nc * (qk_stride + Hv * dv), flops);
      CK(cudaFree(scr));
    }
    CK(cudaFree(state)); CK(cudaFree(gb));
  }
  // 6. Attention prefill (bench_kernels_attn.cpp), with the SIMT tiled kernel.
  bench_prefill_attention(quick, true);
  // 7. GDN decode step batched over sequences (27B shape): gdn_decode (1 launch per layer for
  // all sequences) vs the per-sequence ops the model calls today (conv1d, 2 l2_norms, gates,
  // recurrent: 6 launches per sequence). States live in a pool of 48 layers per slot (slot stride
  // = all layers, as GdnPool); one timed run = the 48 layers in turn, so the state comes from HBM
  // as in a real step. "eager": plain launches (host launch cost included where it dominates);
  // "graph": the same launches replayed from a CUDA graph (device time). Bytes = state r+w.
  {
    const int64_t Hk = 16, Hv = 48, dk = 128, dv = 128, K = 4, C = 2 * Hk * dk + Hv * dv;
    const int64_t n_layers = 48, max_seqs = 32, rec_layer = Hv * dk * dv, conv_layer = K * C;
    const size_t rec_bytes = size_t(max_seqs) * n_layers * rec_layer * 4;
    const size_t conv_bytes = size_t(max_seqs) * n_layers * conv_layer * 4;
    float *rec, *conv, *scr;
    int32_t *slots, *pos;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    CK(cudaMalloc(&rec, rec_bytes));
    CK(cudaMalloc(&conv, conv_bytes));
    CK(cudaMemset(rec, 0x3c, rec_bytes));  // 0.0115 everywhere: finite, not zero
    CK(cudaMemset(conv, 0x3c, conv_bytes));
    CK(cudaMalloc(&scr, size_t(max_seqs) * (C + 2 * Hv) * 4));
    std::vector<int32_t> hs(max_seqs);
    for (int64_t i = 0; i < max_seqs; ++i) hs[i] = static_cast<int32_t>((i * 7) % max_seqs);
    CK(cudaMalloc(&slots, max_seqs * 4));
    CK(cudaMemcpy(slots, hs.data(), max_seqs * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> hp(max_seqs);  // positions: sequences at different conv ring rows
    for (int64_t i = 0; i < max_seqs; ++i) hp[i] = static_cast<int32_t>(1000 + 5 * i);
    CK(cudaMalloc(&pos, max_seqs * 4));
    CK(cudaMemcpy(pos, hp.data(), max_seqs * 4, cudaMemcpyHostToDevice));
    // x holds small finite floats: inputs, conv weights, A_log, dt_bias.
    const float* qkv = x;
    const float* ab = x + max_seqs * C;
    const float* conv_w = x + 2 * max_seqs * C;
    const float* hv_params = conv_w + C * K;
    for (int64_t n : {1, 2, 8, 32}) {
      auto batched = [&]() {
        for (int64_t layer = 0; layer < n_layers; ++layer) {
          cuda::GdnDecodeArgs a{n, qkv, ab, ab + max_seqs * Hv, conv_w, hv_params, hv_params + Hv, slots,
                                pos, conv + layer * conv_layer, n_layers * conv_layer, rec + layer * rec_layer,
                                n_layers * rec_layer, Hk, Hv, dk, dv, K, out};
          cuda::gdn_decode(a, st);
        }
      };
      auto per_seq = [&]() {
        float* g = scr + n * C;
        float* beta = g + n * Hv;
        for (int64_t layer = 0; layer < n_layers; ++layer)
          for (int64_t i = 0; i < n; ++i) {
            float* cs = conv + (hs[i] * n_layers + layer) * conv_layer;
            float* rs = rec + (hs[i] * n_layers + layer) * rec_layer;
            float* yi = scr + i * C;
            cuda::conv1d_causal(qkv + i * C, 1, C, C, conv_w, K, hp[i], cs, yi, st);
            cuda::l2_norm(yi, Hk, dk, 1e-6f, 0.0884f, st);
            cuda::l2_norm(yi + Hk * dk, Hk, dk, 1e-6f, 1.0f, st);
            cuda::gdn_gates(ab + i * Hv, ab + max_seqs * Hv + i * Hv, Hv, 1, Hv, hv_params, hv_params + Hv,
                            g + i * Hv, beta + i * Hv, st);
            cpu::GdnArgs r{yi, yi + Hk * dk, C, yi + 2 * Hk * dk, C, g + i * Hv, beta + i * Hv, 1, Hk, Hv, dk, dv, rs,
                           out + i * Hv * dv};
            cuda::gdn_recurrent(r, st);
          }
      };
      const double bytes = 2.0 * n * rec_layer * 4 * n_layers;
      for (int variant = 0; variant < 2; ++variant) {
        const std::function<void()>& body = variant == 0 ? std::function<void()>(batched) : std::function<void()>(per_seq);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        body();
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int mode = 0; mode < 2; ++mode) {
          const float ms = time_ms([&](int) {
            if (mode == 0) body();
            else CK(cudaGraphLaunch(exec, st));
          });
          char name[96];
          std::snprintf(name, sizeof name, "%s %s 27B n=%lld: %.1f us/layer", variant ? "gdn per-seq ops" : "gdn_decode",
                        mode ? "graph" : "eager", (long long)n, ms * 1e3 / n_layers);
          report(name, ms, bytes);
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
      }
    }
    CK(cudaFree(rec)); CK(cudaFree(conv)); CK(cudaFree(scr)); CK(cudaFree(slots)); CK(cudaFree(pos));
    CK(cudaStreamDestroy(st));
  }
  CK(cudaDeviceSynchronize());
  std::printf("bench done\n");
  return 0;
}
