// Causal GQA prefill attention on sm_90a (H100 / H200) for F16 / BF16 caches, on wgmma: the math,
// the fp16 roundings and the outputs of attention_prefill_sm80.cu (read its header), with the
// tensor-core instructions sm_80 lacks. run_sm80 launches this kernel where sm90_applies (a device
// of compute capability 9.0, a build with sm_90a, attention_prefill_set_variant >= 2).
//
// Why (design decision): at head_dim 256 the sm_80 kernel re-reads K and V from shared memory once
// per warp of 16 query rows through ldmatrix, ~1.5 shared-memory cycles per tensor-core cycle, and
// stops near 200 TFLOP/s. wgmma reads its B operand (K for S = Q K^T, V for O = P V) from shared
// memory once per warpgroup of 64 rows, through the 128-byte swizzle, and keeps no K / V
// fragments in registers.
//
// Block = 128 consecutive queries of ONE q head (grid, order and key split as the sm_80 kernel),
// 2 warpgroups of 64 query rows, 256 threads. Per tile of 64 keys, each warpgroup:
//   S = Q K^T: DP / 16 wgmma m64n64k16 (A = Q, B = K, both from shared memory, K-major);
//   the causal mask, the online softmax and P -> fp16 A fragments exactly as the sm_80 kernel
//   (the m64nN accumulator is, per warp, the m16n8 C layout of N / 8 n tiles);
//   O += P V: 4 key steps x DP / 64 wgmma m64n64k16 (A = P from registers, B = V from shared
//   memory, MN-major: V stays [key][dim] as copied).
// Shared memory, 128-byte swizzled blocks of [64 rows][64 halves] (8 KB, 1024-aligned; the 16-byte
// chunk c of row r at r * 128 + ((c ^ r % 8) * 16)): Q [2 warpgroups][DP / 64 blocks], then two
// buffers of K [DP / 64 blocks] and V [DP / 64 blocks]: DP 64 -> 48 KB, 128 -> 96, 256 -> 192 (+1 KB
// for the alignment). Copies as the sm_80 kernel (cp.async, 16 bytes, double buffer, one barrier a
// tile), each thread making its copies (and Q's stores) visible to wgmma's async proxy
// (fence.proxy.async) before the barrier.
// Accuracy: the operands are the sm_80 kernel's fp16 values; sums fp32 in the tensor cores' order.
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace prefill {
namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PE_SM90A_CODE 1
#endif

constexpr int kThreads = 256, kBM = 128, kBN = 64, kBlockBytes = 64 * 128;

template <int DP>
struct Cfg {
  static constexpr int NB = DP / 64;                  // 64-column blocks of a row
  static constexpr int CPR = DP / 8;                  // 16-byte chunks per row
  static constexpr int RPP = kThreads / CPR;          // key rows per pass of the block
  static constexpr int CHUNKS = kBN / RPP;            // chunks per thread per K (or V) tile
  static constexpr int RR = kBN / 32;                 // cache rows held per lane
  static constexpr int kQBytes = 2 * NB * kBlockBytes;
  static constexpr int kTileBytes = NB * kBlockBytes;  // one K or V buffer
  static constexpr size_t kSmem = kQBytes + 4 * kTileBytes + 1024;
  static_assert(CHUNKS * RPP == kBN && 32 % RPP == 0, "tile shape");
};

// Byte offset of 16-byte chunk cc (of DP / 8) of row r (< 64) in a swizzled [blocks][64][64] array.
__device__ __forceinline__ uint32_t swz(int r, int cc) {
  return static_cast<uint32_t>((cc >> 3) * kBlockBytes + r * 128 + (((cc & 7) ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptors (128-byte swizzle): K-major (rows of 64 halves, 8-row groups
// 1024 bytes apart; a k step of 16 is +32 bytes inside the row) and MN-major (V: n = the row's
// 64 halves, k = rows; 8-row groups 1024 bytes apart, 64-column blocks kBlockBytes apart).
__device__ __forceinline__ uint64_t desc_k(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t desc_mn(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(kBlockBytes >> 4) << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef PE_SM90A_CODE
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef PE_SM90A_CODE
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#ifdef PE_SM90A_CODE
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_async_smem() {
#ifdef PE_SM90A_CODE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of the accumulators across the wgmma fences / waits.
__device__ __forceinline__ void fence_regs(float* d, int n) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (32 floats, the m64n64 accumulator) += A B, A and B from shared memory (K-major); scale_d 0
// ignores d.
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t da, uint64_t db, int scale_d) {
#ifdef PE_SM90A_CODE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
#endif
}
// d += A B, A (4 registers of f16x2, the m16n8k16 A layout per warp) from registers, B from shared
// memory MN-major.
__device__ __forceinline__ void wgmma_rs_t(float* d, const uint32_t (&a)[4], uint64_t db) {
#ifdef PE_SM90A_CODE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
#ifdef PE_SM90A_CODE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef PE_SM90A_CODE
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef PE_SM90A_CODE
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Lane l resolves the cache rows of keys t0 + l + 32 r (r < RR), -1 past n_keys.
template <int DP>
__device__ __forceinline__ void tile_rows(const PrefillParams& p, int t0, int n_keys, int g, int lane,
                                          int64_t (&rows)[Cfg<DP>::RR]) {
#pragma unroll
  for (int r = 0; r < Cfg<DP>::RR; ++r) {
    const int t = t0 + lane + 32 * r;
    rows[r] = t < n_keys ? cache_row(p, t, g) : -1;
  }
}

// This thread's copies of a K and V tile (chunk i: key j = i * RPP + tid / CPR, chunk c = tid %
// CPR of its row) into the swizzled buffers at kb / vb (shared addresses); zeros past the keys
// and past head_dim.
template <int DP>
__device__ __forceinline__ void issue_tile(const PrefillParams& p, const int64_t (&rows)[Cfg<DP>::RR], int tid,
                                           uint32_t kb, uint32_t vb) {
  using C = Cfg<DP>;
  const int c = tid % C::CPR;
  const int64_t rb = 2 * static_cast<int64_t>(p.D);
  const bool col = c * 8 < p.D;
  const uint8_t* kbase = static_cast<const uint8_t*>(p.kv.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.kv.v);
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    const int j = i * C::RPP + tid / C::CPR;
    const int64_t row = __shfl_sync(0xffffffffu, rows[(i * C::RPP) / 32], j & 31);
    const bool ok = row >= 0 && col;
    const int64_t off = ok ? row * rb + c * 16 : 0;
    const uint32_t o = swz(j, c);
    cp_async16(kb + o, kbase + off, ok ? 16 : 0);
    cp_async16(vb + o, vbase + off, ok ? 16 : 0);
  }
  cp_async_commit();
}

// BF16 -> fp16 in place, of the chunks issue_tile gave this thread.
template <int DP>
__device__ __forceinline__ void bf16_tile_to_f16(int tid, unsigned char* buf) {
  using C = Cfg<DP>;
  const int c = tid % C::CPR;
#pragma unroll
  for (int i = 0; i < C::CHUNKS; ++i) {
    uint4* ptr = reinterpret_cast<uint4*>(buf + swz(i * C::RPP + tid / C::CPR, c));
    const uint4 w = *ptr;
    auto cvt = [](uint32_t u) { return half2_bits(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); };
    *ptr = make_uint4(cvt(w.x), cvt(w.y), cvt(w.z), cvt(w.w));
  }
}

template <int DP, bool BF16>
__global__ void __launch_bounds__(kThreads, 1) prefill_sm90_kernel(PrefillParams p) {
#ifdef PE_SM90A_CODE
  using C = Cfg<DP>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* Qs = base;
  unsigned char* KV = base + C::kQBytes;  // buffer b: K at KV + 2b kTileBytes, V at KV + (2b + 1) kTileBytes
  const uint32_t kv_s = smem_u32(KV);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const int gq = lane >> 2, tq = lane & 3;
  const int h = blockIdx.x, g = h / p.group;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * kBM;  // longest query tiles first
  const int D = p.D;
  const int n_keys = p.q_start_pos + min(i0 + kBM, p.n_q);
  const int n_all = (n_keys + kBN - 1) / kBN, per_part = (n_all + p.splits - 1) / p.splits;
  const int it0 = min(n_all, static_cast<int>(blockIdx.z) * per_part), it1 = min(n_all, it0 + per_part);

  int64_t rows[C::RR];
  if (it0 < it1) {
    tile_rows<DP>(p, it0 * kBN, n_keys, g, lane, rows);
    issue_tile<DP>(p, rows, tid, kv_s, kv_s + C::kTileBytes);
    tile_rows<DP>(p, (it0 + 1) * kBN, n_keys, g, lane, rows);
  }

  // Q * scale * log2(e) as fp16, swizzled (zero rows past n_q, zero columns past head_dim).
  for (int e = tid; e < kBM * C::CPR; e += kThreads) {
    const int r = e / C::CPR, c = e % C::CPR, i = i0 + r;
    uint4 hv = make_uint4(0, 0, 0, 0);
    if (i < p.n_q && c * 8 < D) {
      const float* src = p.q + (static_cast<int64_t>(i) * p.n_heads + h) * D + c * 8;
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = src[k] * p.q_mul;
      hv = make_uint4(half2_bits(x[0], x[1]), half2_bits(x[2], x[3]), half2_bits(x[4], x[5]), half2_bits(x[6], x[7]));
    }
    *reinterpret_cast<uint4*>(Qs + (r >> 6) * C::NB * kBlockBytes + swz(r & 63, c)) = hv;
  }
  fence_async_smem();

  // This warpgroup's rows: i0 + 64 wg ..; this warp's: wi0 + (gq, gq + 8).
  const int wg_i0 = i0 + 64 * wg;
  const bool wg_rows = wg_i0 < p.n_q;
  const int wg_last = p.q_start_pos + min(wg_i0 + 63, p.n_q - 1);
  const int wi0 = wg_i0 + 16 * (warp & 3);
  const int pos_first = p.q_start_pos + wi0;
  const int pos0 = pos_first + gq, pos1 = pos0 + 8;
  const uint32_t q_s = smem_u32(Qs + wg * C::NB * kBlockBytes);

  float o[DP / 8][4];
#pragma unroll
  for (int d = 0; d < DP / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float s[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int it = it0; it < it1; ++it) {
    const int t0 = it * kBN;
    const uint32_t ks = kv_s + ((it - it0) & 1) * 2 * C::kTileBytes, vs = ks + C::kTileBytes;
    cp_async_wait_all();
    if constexpr (BF16) {
      bf16_tile_to_f16<DP>(tid, KV + (ks - kv_s));
      bf16_tile_to_f16<DP>(tid, KV + (vs - kv_s));
    }
    fence_async_smem();
    __syncthreads();  // tile it (and Q) visible; every warpgroup is past tile it - 1 (its buffers free)
    if (it + 1 < it1) {
      const uint32_t kn = kv_s + ((it + 1 - it0) & 1) * 2 * C::kTileBytes;
      issue_tile<DP>(p, rows, tid, kn, kn + C::kTileBytes);
      tile_rows<DP>(p, t0 + 2 * kBN, n_keys, g, lane, rows);
    }
    // Warpgroup-uniform: does any of its rows see a key of this tile?
    if (!wg_rows || t0 > wg_last) continue;

    float* sf = &s[0][0];
    fence_regs(sf, 32);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < DP / 16; ++k) {
      const uint32_t off = (k >> 2) * kBlockBytes + (k & 3) * 32;
      wgmma_ss(sf, desc_k(q_s + off), desc_k(ks + off), k > 0);
    }
    wgmma_commit();
    wgmma_wait0();
    fence_regs(sf, 32);
    softmax_tile(s, o, m0, m1, l0, l1, t0, kBN, pos_first, pos0, pos1, tq);
    uint32_t pa[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      pa[k][0] = half2_bits(s[2 * k][0], s[2 * k][1]);
      pa[k][1] = half2_bits(s[2 * k][2], s[2 * k][3]);
      pa[k][2] = half2_bits(s[2 * k + 1][0], s[2 * k + 1][1]);
      pa[k][3] = half2_bits(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
    float* of = &o[0][0];
    fence_regs(of, DP / 2);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int b = 0; b < C::NB; ++b) wgmma_rs_t(of + 32 * b, pa[k], desc_mn(vs + b * kBlockBytes + k * 16 * 128));
    wgmma_commit();
    wgmma_wait0();
    fence_regs(of, DP / 2);
  }

  if (!wg_rows) return;
  finish_rows(p, o, m0, m1, l0, l1, wi0, gq, tq, h);
#else
  (void)p;  // never launched: sm90_applies only where the device runs this build's sm_90a code
#endif
}

template <int DP, bool BF16>
void launch(const PrefillParams& p, cudaStream_t stream) {
  launch_blocks(prefill_sm90_kernel<DP, BF16>, Cfg<DP>::kSmem, kThreads, kBM, p, stream);
}

template <bool BF16>
void launch_d(const PrefillParams& p, cudaStream_t stream) {
  switch (p.D <= 64 ? 64 : p.D <= 128 ? 128 : 256) {
    case 64: return launch<64, BF16>(p, stream);
    case 128: return launch<128, BF16>(p, stream);
    default: return launch<256, BF16>(p, stream);
  }
}

}  // namespace

// Whether the current device runs this build's sm_90a image (compute capability 9.0 exactly).
bool sm90_code() {
  static std::atomic<int> known[64] = {};
  return per_device(known, [] {
    cudaFuncAttributes a;
    const bool ok = compute_capability() == 90 &&
                    cudaFuncGetAttributes(&a, prefill_sm90_kernel<64, false>) == cudaSuccess && a.binaryVersion == 90;
    (void)cudaGetLastError();  // no image for this device: an answer, not an error
    return ok;
  });
}

size_t sm90_smem_bytes(int64_t head_dim) {
  return head_dim <= 64 ? Cfg<64>::kSmem : head_dim <= 128 ? Cfg<128>::kSmem : Cfg<256>::kSmem;
}

void launch_sm90(const PrefillParams& p, cudaStream_t stream) {
  if (p.kv.dtype == DType::BF16) launch_d<true>(p, stream);
  else launch_d<false>(p, stream);
}

}  // namespace prefill
}  // namespace cuda
}  // namespace pe
