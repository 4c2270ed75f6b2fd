// Decode attention over the paged KV cache (n_q <= 16 queries, any context), split-K.
//
// Memory bound: at depth every K/V byte is read once per call. A block owns one KV head, the query
// vectors that share it (the GQA group's heads x a few queries, NV <= 8) and one split of the
// keys; blocks = kv heads x query blocks x splits, the split count chosen to fill the GPU once
// (SMs x resident blocks), so one sequence at batch 1 still uses every SM. Splits > 1 write
// unnormalized (m, l, acc) partials and attention_combine merges them:
// o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, then the output gate. Scores are in the
// log2 domain (scale * log2 e folded into q), exp2 everywhere.
//
// Two kernels (design decision: per-key instructions, not bytes, limited the SIMT kernel; 2 x 6 x
// 256 fp32 FMAs plus ~60 shuffles per key kept the quantized caches as slow as fp16):
//   tensor cores (attention_decode_mma.cu): F16, FP8, I8, NVFP4 caches at head_dim 64 / 128 /
//     256, matching this file's fp32 kernel to ~1e-6; its header has the layout and the
//     measurements against this kernel. Splits of at most 32 keys take its pairs kernel
//     (attention_decode_pairs.cu: two warps share each 16-key step).
//   SIMT fp32 (below): F32 and BF16 caches (not exact in fp16) and other head_dims. Lane groups
//     own keys, lane c chunk c of the row; scores reduced with xor shuffles; online softmax per
//     group over U keys per step; quantized chunks widened without their scale.
#include <algorithm>

#include "kernels/cuda/attention_decode.cuh"

namespace pe {
namespace cuda {
namespace attn {

int64_t max_splits(int64_t n_keys, int64_t min_keys) {
  return std::clamp<int64_t>((n_keys + min_keys - 1) / min_keys, 1, kMaxSplits);
}

int64_t scratch_splits(int64_t n_keys) { return max_splits(n_keys, kMinSplitKeysFloor); }

namespace {

int g_min_split_keys = kMinSplitKeys;  // attention_decode_set_min_split_keys (cuda_ops.h)

template <DType KV> __host__ __device__ constexpr int unroll() { return KV == DType::F32 ? 2 : 4; }

template <DType KV, int NV>
__global__ void __launch_bounds__(kThreads, NV <= 6 ? 3 : 2) attention_decode_kernel(DecodeParams p) {
  pdl_wait();  // launched as a programmatic dependent (launch_decode)
  pdl_trigger();
  constexpr int W = KvChunk<KV>::kWords, U = unroll<KV>();
  constexpr bool kScaled = KV == DType::I8 || KV == DType::NVFP4;
  __shared__ int64_t rows[kWindow];
  __shared__ float red_acc[NV][kMaxD];
  __shared__ float red_m[kWarps][NV], red_l[kWarps][NV];
  __shared__ float fin_l[NV], fin_m[NV];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lpk = 1 << p.lpk_log2, kpw = 32 >> p.lpk_log2;
  const int slot = lane >> p.lpk_log2, c = lane & (lpk - 1);
  const int D = static_cast<int>(p.kv.head_dim);
  const bool has_chunk = c < (D >> 3);
  const int n_groups = kWarps * kpw, gi = warp * kpw + slot;
  const DecodeBlock blk = decode_block(p);
  const int split = blk.split, g = blk.kvh, nqi = blk.nqi, h0 = blk.h0, nh = blk.nh, nv = blk.nv;
  const int64_t i0 = blk.i0;

  float q[NV][8], acc[NV][8], m[NV], l[NV];
  int qoff[NV];  // vector v sees keys up to position qpos0 + qoff[v] (-1: padding, sees none)
  const int64_t qpos0 = p.q_start_pos + i0;
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    m[v] = -INFINITY;
    l[v] = 0.0f;
    qoff[v] = v < nv ? v / nh : -1;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[v][i] = acc[v][i] = 0.0f;
    if (v < nv && has_chunk) {
      const float4* qp = reinterpret_cast<const float4*>(
          p.q + ((i0 + v / nh) * p.n_heads + h0 + v % nh) * D + c * 8);
      const float4 a = qp[0], b = qp[1];
      const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) q[v][i] = x[i] * p.q_mul;
    }
  }

  const int64_t kb = static_cast<int64_t>(split) * p.split_len;
  const int64_t ke = min(kb + p.split_len, p.q_start_pos + i0 + nqi);
  const int64_t rb = kv_row_bytes(KV, D), rs = kv_row_scales(KV, D);
  const uint8_t* kbase = static_cast<const uint8_t*>(p.kv.k) + c * W * 4;
  const uint8_t* vbase = static_cast<const uint8_t*>(p.kv.v) + c * W * 4;
  const int scale_off = KV == DType::NVFP4 ? (c >> 1) : 0;  // a chunk is half an fp4 group

  for (int64_t w0 = kb; w0 < ke; w0 += kWindow) {
    const int wn = static_cast<int>(min(static_cast<int64_t>(kWindow), ke - w0));
    __syncthreads();  // the previous window's rows are no longer read
    resolve_rows(rows, p, w0, wn, g, tid);
    __syncthreads();
    for (int jb = 0; jb < wn; jb += n_groups * U) {  // uniform over the block: shuffles below
      uint32_t kr[U][W], vr[U][W];
      float ksc[U], vsc[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jb + u * n_groups + gi;
        ksc[u] = vsc[u] = 0.0f;
        if (j < wn && has_chunk) {
          const int64_t row = rows[j];
          kv_load_chunk<W>(kbase + row * rb, kr[u]);
          kv_load_chunk<W>(vbase + row * rb, vr[u]);
          if constexpr (kScaled) {
            ksc[u] = __ldg(p.kv.k_scale + row * rs + scale_off);
            vsc[u] = __ldg(p.kv.v_scale + row * rs + scale_off);
          }
        } else {
#pragma unroll
          for (int i = 0; i < W; ++i) kr[u][i] = vr[u][i] = 0u;
        }
      }
      // Scores: partial dots of this lane's chunk, summed over the key's lanes.
      float s[U][NV];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float x[8];
        kv_decode_chunk<KV, W>(kr[u], x);
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          float d = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) d = fmaf(q[v][i], x[i], d);
          s[u][v] = kScaled ? d * ksc[u] : d;
        }
      }
      for (int off = lpk >> 1; off > 0; off >>= 1)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int v = 0; v < NV; ++v) s[u][v] += __shfl_xor_sync(0xffffffffu, s[u][v], off);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jb + u * n_groups + gi;
#pragma unroll
        for (int v = 0; v < NV; ++v)
          if (j >= wn || w0 + j - qpos0 > qoff[v]) s[u][v] = -INFINITY;
      }
      // Online softmax over the U keys (branch-free: an all-masked step leaves the state as is).
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        float mx = m[v];
#pragma unroll
        for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][v]);
        const float base = mx == -INFINITY ? 0.0f : mx;
        const float corr = exp2f(m[v] - base);
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          s[u][v] = exp2f(s[u][v] - base);
          sum += s[u][v];
        }
        l[v] = l[v] * corr + sum;
        m[v] = mx;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[v][i] *= corr;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float x[8];
        kv_decode_chunk<KV, W>(vr[u], x);
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          const float pw = kScaled ? s[u][v] * vsc[u] : s[u][v];
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[v][i] = fmaf(pw, x[i], acc[v][i]);
        }
      }
    }
  }

  // Merge the key groups of each warp (lanes lane ^ k * lpk own the same chunk) ...
  for (int off = lpk; off < 32; off <<= 1) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[v], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[v], off);
      const float mx = fmaxf(m[v], mo), base = mx == -INFINITY ? 0.0f : mx;
      const float a = exp2f(m[v] - base), b = exp2f(mo - base);
      l[v] = l[v] * a + lo * b;
      m[v] = mx;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[v][i] = acc[v][i] * a + __shfl_xor_sync(0xffffffffu, acc[v][i], off) * b;
    }
  }
  // ... then the warps, through shared memory (in a fixed order: deterministic sums).
  for (int e = tid; e < NV * kMaxD; e += kThreads) red_acc[e / kMaxD][e % kMaxD] = 0.0f;
  if (lane == 0)
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      red_m[warp][v] = m[v];
      red_l[warp][v] = l[v];
    }
  __syncthreads();
  float fac[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][v]);
    const float base = mx == -INFINITY ? 0.0f : mx;
    fac[v] = exp2f(m[v] - base);
    if (tid == v) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red_l[w][v] * exp2f(red_m[w][v] - base);
      fin_m[v] = mx;
      fin_l[v] = sum;
    }
  }
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w && lane < lpk && has_chunk)
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int i = 0; i < 8; ++i) red_acc[v][c * 8 + i] += acc[v][i] * fac[v];
    __syncthreads();
  }

  store_decode_result(p, [&](int v, int d) { return red_acc[v][d]; }, fin_m, fin_l, nv, nh, i0, h0, split, D, tid);
}

constexpr int kCombineWarps = 8;
constexpr int kCombineMl = kMaxSplits / 32;  // warp 0's (m, l) pairs per lane: every split
static_assert(kMaxSplits % 32 == 0, "warp 0 holds every split's (m, l)");
// acc partials a thread loads at once (splits warp, warp + 8, ...): the first chunk goes out before
// the weights, so splits <= 8 x 16 = 128 wait one memory round trip; each further chunk one more.
constexpr int kCombineChunk = 16;

// Block (row, 32 dims): warp 0 turns the splits' maxima into weights, the warps sum the splits.
// Every load that does not need the weights (warp 0's m and l, each thread's first chunk of acc
// partials, the gate) is issued first: one round trip before the merge, not one per loop step.
__global__ void __launch_bounds__(kCombineWarps * 32)
    attention_combine_kernel(const float* __restrict__ part, int splits, int64_t n_rows, int D,
                             const float* __restrict__ gate, float* __restrict__ out) {
  pdl_wait();     // launched as a programmatic dependent (launch_pdl)
  pdl_trigger();  // the o_proj GEMV may start prefetching its weights
  __shared__ float wts[kMaxSplits];
  __shared__ float red[kCombineWarps][32];
  __shared__ float inv_l;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;
  const int d = blockIdx.y * 32 + lane;
  const float* a = part + n_rows * 2 * splits + row * D + d;  // read only where d < D
  float acc[kCombineChunk];
  const auto load_chunk = [&](int s0) {  // splits s0 + 8 i of this warp's column d
#pragma unroll
    for (int i = 0; i < kCombineChunk; ++i) {
      const int s = s0 + kCombineWarps * i;
      acc[i] = d < D && s < splits ? a[s * n_rows * D] : 0.0f;
    }
  };
  float ml[kCombineMl][2];
  if (warp == 0)
#pragma unroll
    for (int i = 0; i < kCombineMl; ++i) {
      const int s = lane + 32 * i;
      ml[i][0] = s < splits ? part[(s * n_rows + row) * 2] : 0.0f;
      ml[i][1] = s < splits ? part[(s * n_rows + row) * 2 + 1] : 0.0f;
    }
  load_chunk(warp);
  const float g = warp == 0 && d < D && gate ? gate[row * D + d] : 0.0f;
  if (warp == 0) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kCombineMl; ++i)
      if (lane + 32 * i < splits) mx = fmaxf(mx, ml[i][0]);
    mx = warp_max(mx);
    const float base = mx == -INFINITY ? 0.0f : mx;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kCombineMl; ++i) {
      const int s = lane + 32 * i;
      if (s < splits) {
        const float w = exp2f(ml[i][0] - base);
        wts[s] = w;
        sum += ml[i][1] * w;
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) inv_l = 1.0f / sum;
  }
  __syncthreads();
  float o = 0.0f;
  if (d < D)
    for (int s0 = warp; s0 < splits; s0 += kCombineWarps * kCombineChunk) {
      if (s0 != warp) load_chunk(s0);  // splits past the first chunk: one round trip per chunk
#pragma unroll
      for (int i = 0; i < kCombineChunk; ++i) {
        const int s = s0 + kCombineWarps * i;
        if (s < splits) o = fmaf(wts[s], acc[i], o);
      }
    }
  red[warp][lane] = o;
  __syncthreads();
  if (warp == 0 && d < D) {
    o = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) o += red[w][lane];
    o *= inv_l;
    if (gate) o *= sigmoid_f(g);
    out[row * D + d] = o;
  }
}

template <DType KV, int NV>
int blocks_per_sm() {
  static const int n = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, attention_decode_kernel<KV, NV>, kThreads, 0) !=
        cudaSuccess)
      b = 1;
    return std::max(b, 1);
  }();
  return n;
}

template <DType KV, int NV>
void run_decode(DecodeParams p, int64_t n_keys, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  p.q_mul *= KvChunk<KV>::kUnit;
  p.v_unit = KvChunk<KV>::kUnit;
  launch_decode(attention_decode_kernel<KV, NV>, blocks_per_sm<KV, NV>(), p, n_keys, scratch, scratch_bytes,
                stream);
}

template <DType KV>
void run_decode_nv(int nv, const DecodeParams& p, int64_t n_keys, void* scratch, size_t scratch_bytes,
                   cudaStream_t stream) {
  if (nv <= 2) run_decode<KV, 2>(p, n_keys, scratch, scratch_bytes, stream);
  else if (nv <= 4) run_decode<KV, 4>(p, n_keys, scratch, scratch_bytes, stream);
  else if (nv <= 6) run_decode<KV, 6>(p, n_keys, scratch, scratch_bytes, stream);
  else run_decode<KV, 8>(p, n_keys, scratch, scratch_bytes, stream);
}

}  // namespace

int min_split_keys() { return g_min_split_keys; }

int64_t decode_split_len(const DecodeParams& p, int resident, int64_t n_keys) {
  const int64_t base = static_cast<int64_t>(p.n_qb) * p.n_hb * p.kv.n_kv_heads;
  const int64_t target = static_cast<int64_t>(sm_count()) * resident;
  const int64_t splits = std::clamp<int64_t>(target / base, 1, max_splits(n_keys, min_split_keys()));
  return (n_keys + splits - 1) / splits;
}

void launch_decode(void (*kernel)(DecodeParams), int resident, DecodeParams p, int64_t n_keys,
                   void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  const int64_t base = static_cast<int64_t>(p.n_qb) * p.n_hb * p.kv.n_kv_heads;
  const int64_t len = decode_split_len(p, resident, n_keys);
  const int64_t splits = (n_keys + len - 1) / len;
  const int64_t rows = p.n_q * p.n_heads;
  const size_t need = splits > 1 ? static_cast<size_t>(splits * rows * (p.kv.head_dim + 2)) * sizeof(float) : 0;
  if (scratch_bytes < need)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_paged: scratch of ", scratch_bytes, " bytes, needs ", need);
  p.split_len = static_cast<int>(len);
  p.part = static_cast<float*>(scratch);
  launch_pdl(kernel, dim3(static_cast<unsigned>(splits), static_cast<unsigned>(base)), dim3(kThreads), 0, stream, p);
  PE_CUDA_LAUNCH_CHECK();
  if (splits > 1) attention_combine(p.part, static_cast<int>(splits), rows, static_cast<int>(p.kv.head_dim),
                                    p.gate, p.out, stream);
}

void attention_combine(const float* part, int splits, int64_t n_rows, int D, const float* gate,
                       float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>((D + 31) / 32));
  launch_pdl(attention_combine_kernel, grid, dim3(kCombineWarps * 32), 0, stream, part, splits, n_rows, D, gate, out);
  PE_CUDA_LAUNCH_CHECK();
}

bool decode_applies(int64_t n_q, const float* q, const PagedKV& kv) {
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return n_q <= kDecodeMaxQ && kv.head_dim % 8 == 0 && kv.head_dim <= kMaxD && aligned(q) &&
         aligned(kv.k) && aligned(kv.v);
}

void attention_decode(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                      const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                      float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  DecodeParams p{};
  p.q = q;
  p.gate = gate;
  p.out = out;
  p.pt = page_table;
  p.kv = kv;
  p.n_q = n_q;
  p.q_start_pos = q_start_pos;
  p.n_heads = n_heads;
  p.group = static_cast<int>(n_heads / kv.n_kv_heads);
  p.hb = std::min(p.group, kMaxVecs);
  p.n_hb = (p.group + p.hb - 1) / p.hb;
  p.qb = static_cast<int>(std::min<int64_t>(n_q, std::max(1, kMaxVecs / p.hb)));
  p.n_qb = static_cast<int>((n_q + p.qb - 1) / p.qb);
  const int chunks = static_cast<int>(kv.head_dim / 8);
  while ((1 << p.lpk_log2) < chunks) ++p.lpk_log2;
  p.q_mul = scale * 1.4426950408889634f;  // log2(e): scores in the log2 domain
  const int nv = p.qb * p.hb;
  const int64_t n_keys = q_start_pos + n_q;
  const bool scales_aligned = kv.dtype != DType::NVFP4 || (reinterpret_cast<uintptr_t>(kv.k_scale) % 16 == 0 &&
                                                           reinterpret_cast<uintptr_t>(kv.v_scale) % 16 == 0);
  switch (kv.dtype) {
    case DType::F16:
      if (!run_decode_tc_dim<DType::F16>(p, n_keys, scratch, scratch_bytes, stream))
        run_decode_nv<DType::F16>(nv, p, n_keys, scratch, scratch_bytes, stream);
      break;
    case DType::FP8_E4M3:
      if (!run_decode_tc_dim<DType::FP8_E4M3>(p, n_keys, scratch, scratch_bytes, stream))
        run_decode_nv<DType::FP8_E4M3>(nv, p, n_keys, scratch, scratch_bytes, stream);
      break;
    case DType::I8:
      if (!run_decode_tc_dim<DType::I8>(p, n_keys, scratch, scratch_bytes, stream))
        run_decode_nv<DType::I8>(nv, p, n_keys, scratch, scratch_bytes, stream);
      break;
    case DType::NVFP4:
      if (!scales_aligned || !run_decode_tc_dim<DType::NVFP4>(p, n_keys, scratch, scratch_bytes, stream))
        run_decode_nv<DType::NVFP4>(nv, p, n_keys, scratch, scratch_bytes, stream);
      break;
    case DType::F32: run_decode_nv<DType::F32>(nv, p, n_keys, scratch, scratch_bytes, stream); break;
    default: run_decode_nv<DType::BF16>(nv, p, n_keys, scratch, scratch_bytes, stream); break;
  }
}

}  // namespace attn

void attention_decode_set_min_split_keys(int keys) {
  attn::g_min_split_keys = keys <= 0 ? attn::kMinSplitKeys : std::clamp(keys, attn::kMinSplitKeysFloor, 1 << 16);
}

}  // namespace cuda
}  // namespace pe
