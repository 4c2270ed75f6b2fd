// Prefill attention of the kernel micro-benchmark (bench_kernels.h): one 27B full-attention layer
// (24 q heads, 4 kv heads, head_dim 256, output gate), F16 cache (the engine's default on CUDA),
// pages of 16 in order. Rows:
//   whole prompts from position 0 (4K, 32K; --quick 1K, 4K);
//   one chunk at the end of a context: 512 queries after 4K - 512 and 32K - 512 keys (the engine's
//   default chunk), 4096 after 32K - 4096 (bench_gpu.py's), the F16 and BF16 caches; the
//   stall-free scheduler's chunks beside decoding requests, F16: 128 and 256 queries at 32K (4K
//   with --quick), 512 at 8K (full runs);
// each on attention_prefill_mma's variants (cuda_ops.h attention_prefill_set_variant: v0 the sm_75
// kernel, v1 attention_prefill_sm80.cu and v2 attention_prefill_sm90.cu unsplit where they apply,
// "(=vN)" where not), then "vN split S" where the rule splits the keys into S parts
// (attention_prefill_set_splits 0, the default: its combine launch included), and in full runs the fp32 SIMT tiled kernel behind
// attention_paged on the whole prompts (seconds at 32K: timed once).
// FLOPs causal, Q K^T and P V: 4 * D * Hq * sum over queries of the keys each sees
// (n * start + n (n + 1) / 2). Bytes: K + V of the keys read once + q, gate and out.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_kernels.h"
#include "kernels/cuda/cuda_ops.h"

using namespace pe;

void bench_prefill_attention(bool quick, bool with_tiled) {
  const int64_t Hq = 24, Hkv = 4, D = 256, page = 16, n_max = quick ? 4096 : 32768;
  const size_t act = size_t(n_max) * Hq * D * 4;  // q, gate and out get their own buffers (805 MB each at 32K)
  float* aq = static_cast<float*>(dalloc(act, 10));  // finite floats, |x| < 2
  float* agate = static_cast<float*>(dalloc(act, 11));
  float* aout = static_cast<float*>(dalloc(act, 12));
  void* kc = dalloc(size_t(n_max) * Hkv * D * 2, 7);  // |x| < 2 read as fp16 or bf16
  void* vc = dalloc(size_t(n_max) * Hkv * D * 2, 8);
  std::vector<int32_t> hpt(n_max / page);
  for (size_t i = 0; i < hpt.size(); ++i) hpt[i] = static_cast<int32_t>(i);
  int32_t* pt;
  CK(cudaMalloc(&pt, hpt.size() * 4));
  CK(cudaMemcpy(pt, hpt.data(), hpt.size() * 4, cudaMemcpyHostToDevice));
  const float scale = 0.0625f;

  struct Row { int64_t n, start; DType kv; };
  std::vector<Row> rows;
  for (const int64_t n : {quick ? int64_t(1024) : int64_t(4096), n_max}) rows.push_back({n, 0, DType::F16});
  for (const DType t : {DType::F16, DType::BF16}) {
    rows.push_back({512, 4096 - 512, t});
    rows.push_back({512, n_max - 512, t});
    rows.push_back({4096, n_max - 4096, t});
  }
  rows.push_back({128, n_max - 128, DType::F16});
  rows.push_back({256, n_max - 256, DType::F16});
  if (n_max >= 8192) rows.push_back({512, 8192 - 512, DType::F16});
  size_t scratch_bytes = 0;  // the split rows' partial states (52 MB at most on an H100)
  for (const Row& r : rows)
    scratch_bytes = std::max(scratch_bytes, cuda::attention_prefill_scratch_bytes(r.n, r.start, Hq, D));
  void* scratch = scratch_bytes ? dalloc(scratch_bytes, 13) : nullptr;
  for (const Row& r : rows) {
    const cpu::PagedKV kv{r.kv, kc, vc, nullptr, nullptr, page, Hkv, D};
    const double seen = double(r.n) * r.start + double(r.n) * (r.n + 1) / 2;
    const double flops = 4.0 * D * Hq * seen, bytes = 2.0 * (r.start + r.n) * Hkv * D * 2 + 12.0 * r.n * Hq * D;
    char what[64], name[112];
    if (r.start == 0) std::snprintf(what, sizeof what, "%s n=%lld", dtype_name(r.kv), (long long)r.n);
    else std::snprintf(what, sizeof what, "%s %lld@%lld", dtype_name(r.kv), (long long)r.n, (long long)(r.start + r.n));
    if (with_tiled && r.start == 0) {
      auto tiled = [&](int) { cuda::attention_paged(aq, r.n, 0, Hq, kv, pt, scale, agate, aout, nullptr, 0, nullptr); };
      float ms;
      if (r.n > 8192) {  // one timed run
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a));
        tiled(0);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms, a, b));
        CK(cudaGetLastError());
      } else {
        ms = time_ms(tiled);
      }
      std::snprintf(name, sizeof name, "attn prefill tiled %s (%.0f tok/s)", what, r.n / (ms * 1e-3));
      report(name, ms, bytes, flops);
    }
    const size_t split_bytes = cuda::attention_prefill_scratch_bytes(r.n, r.start, Hq, D);
    const int splits = split_bytes ? static_cast<int>(split_bytes / (size_t(r.n) * Hq * (D + 2) * 4)) : 1;
    const int top = cuda::kAttentionPrefillVariants - 1;
    for (int variant = 0; variant <= cuda::kAttentionPrefillVariants; ++variant) {
      const bool split = variant == cuda::kAttentionPrefillVariants;  // the default variant with the rule's split
      if (split && splits < 2) break;
      cuda::attention_prefill_set_variant(split ? top : variant);
      cuda::attention_prefill_set_splits(split ? 0 : 1);
      const bool sm80 = cuda::attention_prefill_sm80_applies(kv), sm90 = cuda::attention_prefill_sm90_applies(kv);
      if (split && !sm80) break;
      // What the variant runs: v2 falls back to v1, v1 to v0, where their kernel does not apply.
      const int ran = sm90 ? 2 : sm80 ? 1 : 0;
      const float ms = time_ms([&](int) {
        cuda::attention_prefill_mma(aq, r.n, r.start, Hq, kv, pt, scale, agate, aout, scratch, scratch_bytes, nullptr);
      });
      if (split) std::snprintf(name, sizeof name, "attn prefill v%d split %d %s (%.0f tok/s)", ran, splits, what, r.n / (ms * 1e-3));
      else if (ran != variant)
        std::snprintf(name, sizeof name, "attn prefill v%d(=v%d) %s (%.0f tok/s)", variant, ran, what, r.n / (ms * 1e-3));
      else std::snprintf(name, sizeof name, "attn prefill v%d %s (%.0f tok/s)", variant, what, r.n / (ms * 1e-3));
      report(name, ms, bytes, flops);
    }
    cuda::attention_prefill_set_variant(top);
    cuda::attention_prefill_set_splits(0);
  }
  if (scratch) CK(cudaFree(scratch));
  CK(cudaFree(aq)); CK(cudaFree(agate)); CK(cudaFree(aout)); CK(cudaFree(kc)); CK(cudaFree(vc)); CK(cudaFree(pt));
}
