// Causal GQA attention over the paged KV cache: the public attention_paged and its dispatch.
//
// Cache layout (PagedKV): k, v [n_pages, page_size, n_kv_heads] rows of head_dim values in one of
// the kv_codec.cuh formats (F32, F16, BF16, FP8_E4M3, I8 + row scale, NVFP4 + group scales);
// token t of the sequence is row t % page_size of page page_table[t / page_size].
// Two kernels:
//   decode (attention_decode.cu): n_q <= 16, head_dim % 8 == 0 — memory bound, split-K over the
//     whole GPU, vector loads of whole chunks;
//   tiled (this file): everything else (prefill, odd head_dim). A block owns up to 16 query
//     vectors (QT consecutive queries x HB heads of one KV group, so each K/V row is loaded once
//     for all of them) and walks its keys in tiles of 16 with an online softmax: scores
//     s = scale q.k (-inf past the query's position), running max m, sum l, accumulator acc[v][d]
//     in registers (thread owns dims tid, tid + 128). Short prefills split the keys over
//     blockIdx.y like the decode kernel and share its combine kernel. SIMT fp32 (no tensor cores
//     yet). Elements are decoded one at a time (kv_element), any head_dim <= 256.
// Both keep scores in the log2 domain (scale * log2 e), so the partial states are interchangeable.
#include <algorithm>

#include "kernels/cuda/kv_codec.cuh"

namespace pe {
namespace cuda {
namespace attn {  // attention_decode.cu
int64_t scratch_splits(int64_t n_keys);
constexpr int64_t kDecodeMaxQueries = 16;  // attention_decode.cu: kDecodeMaxQ
bool decode_applies(int64_t n_q, const float* q, const PagedKV& kv);
void attention_decode(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                      const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                      float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream);
void attention_combine(const float* part, int splits, int64_t n_rows, int D, const float* gate,
                       float* out, cudaStream_t stream);
}  // namespace attn
namespace {

constexpr int kThreads = 128, kMaxVec = 16, kKeyTile = 16, kMaxD = 256;

// Cache row of (position t, kv head g): row * head_dim values (and row * scales per row).
__device__ __forceinline__ int64_t kv_row(const PagedKV& kv, const int32_t* pt, int64_t t, int g) {
  return (static_cast<int64_t>(pt[t / kv.page_size]) * kv.page_size + t % kv.page_size) * kv.n_kv_heads + g;
}

struct AttnParams {
  const float* q;
  const float* gate;
  float* out;
  float* part;  // split-K partials: [splits][n_q][n_heads] x (m, l) then x D accumulators
  const int32_t* pt;
  PagedKV kv;
  int64_t n_q, q_start_pos, n_heads;
  int group, hb, n_hb, qt, n_qt, split_len;
  float scale;  // softmax scale * log2(e)
};

template <DType KV>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnParams p) {
  __shared__ float qs[kMaxVec][kMaxD + 1];
  __shared__ float kvs[kKeyTile][kMaxD + 1];
  __shared__ float ps[kMaxVec][kKeyTile];
  __shared__ float ms[kMaxVec], ls[kMaxVec], cs[kMaxVec];
  const int tid = threadIdx.x;
  const int D = static_cast<int>(p.kv.head_dim);
  // Block -> (query tile, kv head, head block); split on y.
  const int qtile = blockIdx.x % p.n_qt, rest = blockIdx.x / p.n_qt;
  const int hblk = rest % p.n_hb, g = rest / p.n_hb;
  const int64_t i0 = static_cast<int64_t>(qtile) * p.qt;
  const int nqi = static_cast<int>(min((int64_t)p.qt, p.n_q - i0));
  const int h0 = g * p.group + hblk * p.hb, nh = min(p.hb, p.group - hblk * p.hb);
  const int nv = nqi * nh;
  // Vector v = (query i0 + v / nh, head h0 + v % nh).
  for (int e = tid; e < nv * D; e += kThreads) {
    const int v = e / D, d = e % D;
    qs[v][d] = p.q[((i0 + v / nh) * p.n_heads + h0 + v % nh) * D + d];
  }
  if (tid < kMaxVec) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.0f;
  }
  float acc[kMaxVec][2];
#pragma unroll
  for (int v = 0; v < kMaxVec; ++v) acc[v][0] = acc[v][1] = 0.0f;

  const int64_t pos_max = p.q_start_pos + i0 + nqi - 1;
  const int64_t kb = static_cast<int64_t>(blockIdx.y) * p.split_len;
  const int64_t ke = min((int64_t)kb + p.split_len, pos_max + 1);
  __syncthreads();
  for (int64_t t0 = kb; t0 < ke; t0 += kKeyTile) {
    for (int e = tid; e < kKeyTile * D; e += kThreads) {
      const int j = e / D, d = e % D;
      kvs[j][d] = t0 + j < ke ? kv_element<KV>(p.kv.k, p.kv.k_scale, kv_row(p.kv, p.pt, t0 + j, g), D, d) : 0.0f;
    }
    __syncthreads();
    for (int pr = tid; pr < kMaxVec * kKeyTile; pr += kThreads) {
      const int v = pr / kKeyTile, j = pr % kKeyTile;
      if (v >= nv) continue;
      const int64_t qpos = p.q_start_pos + i0 + v / nh;
      float s = -INFINITY;
      if (t0 + j < ke && t0 + j <= qpos) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qs[v][d], kvs[j][d], dot);
        s = dot * p.scale;
      }
      ps[v][j] = s;
    }
    __syncthreads();
    if (tid < nv) {
      float mt = -INFINITY;
      for (int j = 0; j < kKeyTile; ++j) mt = fmaxf(mt, ps[tid][j]);
      const float m_old = ms[tid], m_new = fmaxf(m_old, mt);
      float c = 1.0f, sum = 0.0f;
      if (m_new != -INFINITY) {
        c = exp2f(m_old - m_new);
        for (int j = 0; j < kKeyTile; ++j) {
          const float e = exp2f(ps[tid][j] - m_new);
          ps[tid][j] = e;
          sum += e;
        }
      } else {
        for (int j = 0; j < kKeyTile; ++j) ps[tid][j] = 0.0f;
      }
      ms[tid] = m_new;
      ls[tid] = ls[tid] * c + sum;
      cs[tid] = c;
    }
    // V rows into the K buffer (its K reads finished at the barrier above), alongside the softmax.
    for (int e = tid; e < kKeyTile * D; e += kThreads) {
      const int j = e / D, d = e % D;
      kvs[j][d] = t0 + j < ke ? kv_element<KV>(p.kv.v, p.kv.v_scale, kv_row(p.kv, p.pt, t0 + j, g), D, d) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int v = 0; v < kMaxVec; ++v) {
      if (v >= nv) break;
      const float c = cs[v];
#pragma unroll
      for (int jd = 0; jd < 2; ++jd) {
        const int d = tid + jd * kThreads;
        if (d >= D) continue;
        float a = acc[v][jd] * c;
        for (int j = 0; j < kKeyTile; ++j) a = fmaf(ps[v][j], kvs[j][d], a);
        acc[v][jd] = a;
      }
    }
    __syncthreads();
  }
  // Write the normalized, gated output (one split) or the raw partial state.
  const bool direct = gridDim.y == 1;
#pragma unroll
  for (int v = 0; v < kMaxVec; ++v) {
    if (v >= nv) break;
    const int64_t qi = i0 + v / nh, h = h0 + v % nh;
    const int64_t row = qi * p.n_heads + h;
    const float inv_l = direct ? 1.0f / ls[v] : 1.0f;
#pragma unroll
    for (int jd = 0; jd < 2; ++jd) {
      const int d = tid + jd * kThreads;
      if (d >= D) continue;
      if (direct) {
        float o = acc[v][jd] * inv_l;
        if (p.gate) o *= sigmoid_f(p.gate[row * D + d]);
        p.out[row * D + d] = o;
      } else {
        const int64_t rows = p.n_q * p.n_heads;
        p.part[rows * 2 * gridDim.y + (blockIdx.y * rows + row) * D + d] = acc[v][jd];
      }
    }
    if (!direct && tid == 0) {
      const int64_t rows = p.n_q * p.n_heads;
      p.part[(blockIdx.y * rows + row) * 2] = ms[v];
      p.part[(blockIdx.y * rows + row) * 2 + 1] = ls[v];
    }
  }
}

struct Plan {
  int hb, n_hb, qt, n_qt, splits, split_len;
};

// Splits <= attn::max_splits(n_keys), the bound attention_paged_scratch_bytes sizes for.
Plan make_plan(int64_t n_q, int64_t q_start_pos, int64_t n_heads, int64_t n_kv_heads) {
  Plan pl;
  const int group = static_cast<int>(n_heads / n_kv_heads);
  pl.hb = std::min(group, kMaxVec);
  pl.n_hb = (group + pl.hb - 1) / pl.hb;
  pl.qt = std::max(1, kMaxVec / pl.hb);
  pl.n_qt = static_cast<int>((n_q + pl.qt - 1) / pl.qt);
  const int64_t base = static_cast<int64_t>(pl.n_qt) * n_kv_heads * pl.n_hb;
  const int64_t n_keys = q_start_pos + n_q;
  int64_t splits = std::max<int64_t>(1, (256 + base - 1) / base);
  splits = std::min<int64_t>({splits, 64, (n_keys + 255) / 256});
  splits = std::max<int64_t>(splits, 1);
  int64_t len = (n_keys + splits - 1) / splits;
  len = (len + kKeyTile - 1) / kKeyTile * kKeyTile;
  pl.splits = static_cast<int>((n_keys + len - 1) / len);
  pl.split_len = static_cast<int>(len);
  return pl;
}

template <DType KV>
void launch_tiled(const AttnParams& p, dim3 grid, cudaStream_t stream) {
  attention_kernel<KV><<<grid, kThreads, 0, stream>>>(p);
}

}  // namespace

size_t attention_paged_scratch_bytes(int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim) {
  if (n_q <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 0;
  // The tiled kernel's split count is exact (make_plan: 1 for long prefill chunks, so they need
  // none); the decode kernel's (n_q <= 16) depends on the GPU and is bounded by scratch_splits.
  int64_t splits = make_plan(n_q, q_start_pos, n_heads, n_kv_heads).splits;
  if (n_q <= attn::kDecodeMaxQueries) splits = std::max(splits, attn::scratch_splits(q_start_pos + n_q));
  const size_t tiled = splits == 1 ? 0 : static_cast<size_t>(splits) * n_q * n_heads * (head_dim + 2) * sizeof(float);
  // Chunks for attention_prefill_mma: its sm_80 kernel's key split.
  if (n_q < kAttentionMmaMinQueries) return tiled;
  return std::max(tiled, attention_prefill_scratch_bytes(n_q, q_start_pos, n_heads, head_dim));
}

void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (n_q <= 0) return;
  switch (kv.dtype) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::FP8_E4M3: case DType::I8: case DType::NVFP4: break;
    default: fail(PE_ERR_UNSUPPORTED, "cuda::attention_paged: unsupported cache dtype ", dtype_name(kv.dtype));
  }
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_paged: n_heads must be a multiple of n_kv_heads");
  if (kv.head_dim <= 0 || kv.head_dim > kMaxD)
    fail(PE_ERR_UNSUPPORTED, "cuda::attention_paged: head_dim must be 1..", kMaxD);
  if (kv.dtype == DType::NVFP4 && kv.head_dim % kKvFp4Group != 0)
    fail(PE_ERR_UNSUPPORTED, "cuda::attention_paged: nvfp4 cache needs head_dim % 16 == 0");
  if (kv_row_scales(kv.dtype, kv.head_dim) && (!kv.k_scale || !kv.v_scale))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_paged: ", dtype_name(kv.dtype), " cache without scales");
  if (attn::decode_applies(n_q, q, kv)) {
    attn::attention_decode(q, n_q, q_start_pos, n_heads, kv, page_table, scale, gate, out, scratch,
                           scratch_bytes, stream);
    return;
  }
  // Prefill chunks of >= 64 queries (a full query tile per block) run on the tensor cores
  // (attention_prefill_mma.cu). Shorter chunks at depth keep the split-K tiled kernel: one block per 64 queries and head
  // would leave most SMs idle there. Shapes the mma kernel refuses fall back too.
  if (n_q >= kAttentionMmaMinQueries && attention_prefill_mma_supported(n_q, kv)) {
    attention_prefill_mma(q, n_q, q_start_pos, n_heads, kv, page_table, scale, gate, out, scratch, scratch_bytes,
                          stream);
    return;
  }
  const Plan pl = make_plan(n_q, q_start_pos, n_heads, kv.n_kv_heads);
  const size_t need = pl.splits == 1 ? 0 : static_cast<size_t>(pl.splits) * n_q * n_heads * (kv.head_dim + 2) * sizeof(float);
  if (scratch_bytes < need)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_paged: scratch of ", scratch_bytes,
         " bytes, needs ", need);
  AttnParams p;
  p.q = q;
  p.gate = gate;
  p.out = out;
  p.part = static_cast<float*>(scratch);
  p.pt = page_table;
  p.kv = kv;
  p.n_q = n_q;
  p.q_start_pos = q_start_pos;
  p.n_heads = n_heads;
  p.group = static_cast<int>(n_heads / kv.n_kv_heads);
  p.hb = pl.hb;
  p.n_hb = pl.n_hb;
  p.qt = pl.qt;
  p.n_qt = pl.n_qt;
  p.split_len = pl.split_len;
  p.scale = scale * 1.4426950408889634f;
  const int64_t nb = static_cast<int64_t>(pl.n_qt) * kv.n_kv_heads * pl.n_hb;
  if (nb > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::attention_paged: too many queries");
  const dim3 grid(static_cast<unsigned>(nb), pl.splits);
  switch (kv.dtype) {
    case DType::F32: launch_tiled<DType::F32>(p, grid, stream); break;
    case DType::F16: launch_tiled<DType::F16>(p, grid, stream); break;
    case DType::BF16: launch_tiled<DType::BF16>(p, grid, stream); break;
    case DType::FP8_E4M3: launch_tiled<DType::FP8_E4M3>(p, grid, stream); break;
    case DType::I8: launch_tiled<DType::I8>(p, grid, stream); break;
    default: launch_tiled<DType::NVFP4>(p, grid, stream); break;
  }
  PE_CUDA_LAUNCH_CHECK();
  if (pl.splits > 1)
    attn::attention_combine(p.part, pl.splits, n_q * n_heads, static_cast<int>(kv.head_dim), gate, out, stream);
}

}  // namespace cuda
}  // namespace pe
