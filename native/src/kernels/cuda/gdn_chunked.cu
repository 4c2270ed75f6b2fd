// Gated delta rule, chunked (WY/UT) form for multi-token forwards, fp32 (MODEL_SPEC §3):
// within a chunk of L <= 64 tokens with gamma = cumsum(g):
//   A[i,j] = beta_i (k_i.k_j) e^{gamma_i - gamma_j} (j < i),  T = (I + A)^-1,  T' = T diag(beta)
//   V' = T' (V - e^gamma (K S))                               (= U - W S of the spec)
//   O  = e^gamma (Q S) + P V',  P = M . Q K^T,  M[i,j] = e^{gamma_i - gamma_j} (j <= i)
//   S  = e^{gamma_L} S + (e^{gamma_L - gamma} K)^T V'
// Design decision: two passes. Everything that does not touch S (T' and P, 64 x 64 each, plus
// gamma) is computed first for all chunks at once (intra pass, grid chunks x heads) into global
// scratch; the inter pass then walks the chunks in order with a block per (value head, 16
// columns of S): the columns of S evolve independently, so 48 heads x 8 groups = 384 blocks, 3
// resident per SM, each keeping its state slice S^T [16, dk] in shared memory. Per chunk it does
// K S and Q S (64 x dk x 16 each), T' Y, P V' and the rank-64 state update, as register-tiled
// fp32 SIMT products over shared-memory tiles (float4 reads, row strides = 4 mod 32 banks).
// The sequence is cut into segments that fit the caller's scratch; the state carries over.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kC = 64;                 // chunk capacity (tokens)
constexpr int kCols = 16;              // state columns per inter-pass block
constexpr int kThreads = 256;
constexpr int kLdT = kC + 4;           // row stride of 64-wide tiles (T', P, A, V'^T)
constexpr int kMaxDk = 128;
constexpr int64_t kSegChunks = 32;     // chunks per segment when the scratch allows it
constexpr int64_t kPerChunk = 2 * kC * kC + kC;  // floats of scratch per (chunk, head): T', P, gamma

// Row stride of a [64, dk] tile: dk rounded to 32, plus 4 (float4 rows of 8 lanes hit 8 bank groups).
__host__ __device__ inline int ld_rows(int dk) { return (dk + 31) / 32 * 32 + 4; }

size_t inter_smem_bytes(int dk) {
  const int ld = ld_rows(dk);
  return sizeof(float) * (static_cast<size_t>(kCols) * ld + kC * ld + kC * kLdT + kCols * kLdT + 3 * kC);
}
constexpr size_t kIntraSmemBytes = sizeof(float) * (2 * kC * kLdT + 2 * kC);

// dst[i][k] = src row i (token t0 + i), columns [k0, k0 + width) of a head slice; zero outside
// the chunk (i >= L) and past dk, so float4 reads of padded rows add zeros.
__device__ __forceinline__ void load_tile(float* dst, int ld, const float* src, int64_t stride,
                                          int L, int k0, int width, int dk) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = warp; i < kC; i += kThreads / 32) {
    const float* row = src + i * stride;
    for (int k = lane; k < width; k += 32)
      dst[i * ld + k] = (i < L && k0 + k < dk) ? row[k0 + k] : 0.0f;
  }
}

__device__ __forceinline__ void fma4(float& acc, const float4& x, const float4& y) {
  acc = fmaf(x.x, y.x, acc);
  acc = fmaf(x.y, y.y, acc);
  acc = fmaf(x.z, y.z, acc);
  acc = fmaf(x.w, y.w, acc);
}

// ---- Intra pass: per (chunk, value head) T' and P into scratch. ----
// Block (c, h); thread (ti, tj) = (tid / 16, tid % 16) owns rows ti + 16a, columns tj + 16b of
// the 64 x 64 products K K^T and Q K^T (accumulated over dk in slices of 64).
__global__ void __launch_bounds__(kThreads) gdn_intra_kernel(GdnArgs a, int64_t seg_t0, int chunk,
                                                             float* scratch) {
  extern __shared__ float sm[];
  float* Ks = sm;                 // [64][kLdT]: K slice, then A
  float* Qs = Ks + kC * kLdT;     // [64][kLdT]: Q slice, then T
  float* gam = Qs + kC * kLdT;
  float* bet = gam + kC;
  const int tid = threadIdx.x, ti = tid >> 4, tj = tid & 15;
  const int c = blockIdx.x, h = blockIdx.y, Hv = static_cast<int>(a.Hv);
  const int dk = static_cast<int>(a.dk), kh = static_cast<int>(h / (a.Hv / a.Hk));
  const int64_t t0 = seg_t0 + static_cast<int64_t>(c) * chunk;
  const int L = static_cast<int>(min(static_cast<int64_t>(chunk), a.n - t0));
  if (tid < kC) {
    gam[tid] = tid < L ? a.g[(t0 + tid) * Hv + h] : 0.0f;
    bet[tid] = tid < L ? a.beta[(t0 + tid) * Hv + h] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {  // sequential cumsum, the CPU order; rows past L repeat gamma_{L-1}
    float s = 0.0f;
    for (int i = 0; i < kC; ++i) { s += gam[i]; gam[i] = s; }
  }
  float G[4][4] = {}, R[4][4] = {};
  const float* kbase = a.k + t0 * a.qk_stride + static_cast<int64_t>(kh) * dk;
  const float* qbase = a.q + t0 * a.qk_stride + static_cast<int64_t>(kh) * dk;
  for (int k0 = 0; k0 < dk; k0 += kC) {
    __syncthreads();
    load_tile(Ks, kLdT, kbase, a.qk_stride, L, k0, kC, dk);
    load_tile(Qs, kLdT, qbase, a.qk_stride, L, k0, kC, dk);
    __syncthreads();
    const int w = min(kC, (dk - k0 + 3) & ~3);
    for (int kk = 0; kk < w; kk += 4) {
      float4 kr[4], qr[4], kc[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        kr[u] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * u) * kLdT + kk);
        qr[u] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * u) * kLdT + kk);
        kc[u] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * u) * kLdT + kk);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          fma4(G[x][y], kr[x], kc[y]);
          fma4(R[x][y], qr[x], kc[y]);
        }
    }
  }
  float* out = scratch + (static_cast<int64_t>(c) * Hv + h) * kPerChunk;  // T' | P | gamma
  __syncthreads();  // done reading Ks / Qs
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      const int i = ti + 16 * x, j = tj + 16 * y;
      const float d = expf(gam[i] - gam[j]);
      out[kC * kC + i * kC + j] = (j <= i && i < L) ? d * R[x][y] : 0.0f;
      Ks[i * kLdT + j] = j < i ? bet[i] * d * G[x][y] : 0.0f;
    }
  if (tid < kC) out[2 * kC * kC + tid] = gam[min(tid, L - 1)];
  __syncthreads();
  // T = (I + A)^-1 by forward substitution, column j by 4 lanes (tid = 4 j + part):
  // T[i][j] = -sum_{j <= m < i} A[i][m] T[m][j]. A column only reads its own entries: no barrier.
  {
    const int j = tid >> 2, part = tid & 3;
    float* T = Qs;
    for (int i = part; i < kC; i += 4) T[i * kLdT + j] = i == j ? 1.0f : 0.0f;
    __syncwarp();
    for (int i = 1; i < kC; ++i) {
      float s = 0.0f;
      for (int m = j + part; m < i; m += 4) s = fmaf(Ks[i * kLdT + m], T[m * kLdT + j], s);
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (part == 0 && i > j) T[i * kLdT + j] = -s;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int e = tid; e < kC * kC; e += kThreads) {
    const int i = e / kC, m = e % kC;
    out[e] = Qs[i * kLdT + m] * bet[m];  // T' = T diag(beta); beta = 0 past L
  }
}

// ---- Inter pass: block (value head h, columns [j0, j0 + 16)) walks the segment's chunks. ----
// Thread (r, j) = (tid / 16, tid % 16) owns rows r + 16a (a < 4) of the [64, 16] products and,
// for the state update, S^T[j][4r .. 4r + 3] and S^T[j][64 + 4r .. 64 + 4r + 3].
__global__ void __launch_bounds__(kThreads, 3) gdn_inter_kernel(GdnArgs a, int64_t seg_t0, int chunk,
                                                             int n_chunks, const float* scratch) {
  extern __shared__ float sm[];
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv), Hv = static_cast<int>(a.Hv);
  const int ld = ld_rows(dk), dkp = (dk + 3) & ~3;
  float* St = sm;                  // [16][ld]   S^T of the block's columns
  float* X = St + kCols * ld;      // [64][ld]   Q, then K of the chunk
  float* Tb = X + kC * ld;         // [64][kLdT] T', then P
  float* Yt = Tb + kC * kLdT;      // [16][kLdT] Y^T, then V'^T
  float* eg = Yt + kCols * kLdT;   // e^gamma
  float* kd = eg + kC;             // e^{gamma_L - gamma}
  float* gam = kd + kC;
  const int tid = threadIdx.x, r = tid >> 4, j = tid & 15;
  const int h = blockIdx.x, kh = static_cast<int>(h / (a.Hv / a.Hk));
  const int j0 = blockIdx.y * kCols, ncols = min(kCols, dv - j0);
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  for (int e = tid; e < kCols * ld; e += kThreads) {
    const int jj = e / ld, k = e % ld;
    St[e] = (jj < ncols && k < dk) ? S[static_cast<int64_t>(k) * dv + j0 + jj] : 0.0f;
  }
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t t0 = seg_t0 + static_cast<int64_t>(c) * chunk;
    const int L = static_cast<int>(min(static_cast<int64_t>(chunk), a.n - t0));
    const float* sc = scratch + (static_cast<int64_t>(c) * Hv + h) * kPerChunk;
    const float* qkoff = a.q + t0 * a.qk_stride + static_cast<int64_t>(kh) * dk;
    __syncthreads();  // previous chunk done with X, Tb, Yt, eg, kd; St initialized
    if (tid < kC) gam[tid] = sc[2 * kC * kC + tid];
    load_tile(X, ld, qkoff, a.qk_stride, L, 0, dkp, dk);
    __syncthreads();
    if (tid < kC) {
      eg[tid] = expf(gam[tid]);
      kd[tid] = expf(gam[kC - 1] - gam[tid]);  // gamma is padded with gamma_{L-1}
    }
    // QS = Q S (rows r + 16a, column j), kept in registers until O.
    float qs[4] = {}, acc[4] = {};
    for (int k = 0; k < dkp; k += 4) {
      const float4 s4 = *reinterpret_cast<const float4*>(St + j * ld + k);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma4(qs[u], *reinterpret_cast<const float4*>(X + (r + 16 * u) * ld + k), s4);
    }
    __syncthreads();
    load_tile(X, ld, a.k + (qkoff - a.q), a.qk_stride, L, 0, dkp, dk);
    for (int e = tid; e < kC * kC / 4; e += kThreads) {
      const int i = e / (kC / 4), m = 4 * (e % (kC / 4));
      *reinterpret_cast<float4*>(Tb + i * kLdT + m) = *reinterpret_cast<const float4*>(sc + i * kC + m);
    }
    __syncthreads();
    // Y = V - e^gamma (K S), stored transposed.
    for (int k = 0; k < dkp; k += 4) {
      const float4 s4 = *reinterpret_cast<const float4*>(St + j * ld + k);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma4(acc[u], *reinterpret_cast<const float4*>(X + (r + 16 * u) * ld + k), s4);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = r + 16 * u;
      const float v = (i < L && j < ncols) ? a.v[(t0 + i) * a.v_stride + static_cast<int64_t>(h) * dv + j0 + j] : 0.0f;
      Yt[j * kLdT + i] = v - eg[i] * acc[u];
      acc[u] = 0.0f;
    }
    __syncthreads();
    // V' = T' Y (T' lower triangular: row i needs m <= i).
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = r + 16 * u;
      for (int m = 0; m < 16 * u + 16; m += 4)
        fma4(acc[u], *reinterpret_cast<const float4*>(Tb + i * kLdT + m),
             *reinterpret_cast<const float4*>(Yt + j * kLdT + m));
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; ++u) Yt[j * kLdT + r + 16 * u] = acc[u];
    __syncthreads();
    // S^T[j][k] = e^{gamma_L} S^T[j][k] + sum_i kd_i K[i][k] V'[i][j]; then P replaces T'.
    {
      const float eL = expf(gam[kC - 1]);
      float4 d[2] = {};
      const int Lr = (L + 3) & ~3;
      for (int i = 0; i < Lr; i += 4) {
        float4 w = *reinterpret_cast<const float4*>(Yt + j * kLdT + i);
        w.x *= kd[i]; w.y *= kd[i + 1]; w.z *= kd[i + 2]; w.w *= kd[i + 3];
        const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            if (4 * r + 64 * b >= dkp) continue;
            const float4 kx = *reinterpret_cast<const float4*>(X + (i + u) * ld + 4 * r + 64 * b);
            d[b].x = fmaf(kx.x, wv[u], d[b].x);
            d[b].y = fmaf(kx.y, wv[u], d[b].y);
            d[b].z = fmaf(kx.z, wv[u], d[b].z);
            d[b].w = fmaf(kx.w, wv[u], d[b].w);
          }
      }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (4 * r + 64 * b >= dkp) continue;
        float4* p = reinterpret_cast<float4*>(St + j * ld + 4 * r + 64 * b);
        const float4 s4 = *p;
        *p = make_float4(fmaf(eL, s4.x, d[b].x), fmaf(eL, s4.y, d[b].y), fmaf(eL, s4.z, d[b].z),
                         fmaf(eL, s4.w, d[b].w));
      }
    }
    __syncthreads();  // T' and K reads done
    for (int e = tid; e < kC * kC / 4; e += kThreads) {
      const int i = e / (kC / 4), m = 4 * (e % (kC / 4));
      *reinterpret_cast<float4*>(Tb + i * kLdT + m) = *reinterpret_cast<const float4*>(sc + kC * kC + i * kC + m);
    }
    __syncthreads();
    // O = e^gamma (Q S) + P V'.
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = r + 16 * u;
      float o = 0.0f;
      for (int m = 0; m < 16 * u + 16; m += 4)
        fma4(o, *reinterpret_cast<const float4*>(Tb + i * kLdT + m),
             *reinterpret_cast<const float4*>(Yt + j * kLdT + m));
      if (i < L && j < ncols)
        a.out[((t0 + i) * Hv + h) * dv + j0 + j] = fmaf(eg[i], qs[u], o);
    }
  }
  __syncthreads();
  for (int e = tid; e < kCols * dk; e += kThreads) {
    const int k = e / kCols, jj = e % kCols;
    if (jj < ncols) S[static_cast<int64_t>(k) * dv + j0 + jj] = St[jj * ld + k];
  }
}

void check_args(const GdnArgs& a, int64_t chunk) {
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chunked: Hv must be a multiple of Hk");
  if (chunk < 1 || chunk > kC) fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chunked: chunk must be 1..64");
  if (a.dk <= 0 || a.dk > kMaxDk || a.dv <= 0)
    fail(PE_ERR_UNSUPPORTED, "cuda::gdn_chunked: dk must be 1..128");
}

}  // namespace

size_t gdn_chunked_scratch_bytes(int64_t n, int64_t Hv, int64_t chunk) {
  if (n <= 0 || chunk < 1) return 0;
  const int64_t chunks = std::min((n + chunk - 1) / chunk, kSegChunks);
  return static_cast<size_t>(chunks * Hv * kPerChunk) * sizeof(float);
}

void gdn_chunked(const GdnArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                 int64_t chunk) {
  if (a.n <= 0) return;
  check_args(a, chunk);
  const int64_t per_chunk_bytes = a.Hv * kPerChunk * static_cast<int64_t>(sizeof(float));
  const int64_t seg_chunks = std::min<int64_t>(static_cast<int64_t>(scratch_bytes) / per_chunk_bytes, kSegChunks);
  if (scratch == nullptr || seg_chunks < 1)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chunked: scratch smaller than one chunk (",
         per_chunk_bytes, " bytes)");
  const size_t inter_smem = inter_smem_bytes(static_cast<int>(a.dk));
  PE_CUDA_CHECK(cudaFuncSetAttribute(gdn_inter_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(inter_smem)));
  float* sc = static_cast<float*>(scratch);
  const int64_t total = (a.n + chunk - 1) / chunk;
  for (int64_t c0 = 0; c0 < total; c0 += seg_chunks) {
    const int n_chunks = static_cast<int>(std::min(seg_chunks, total - c0));
    const int64_t seg_t0 = c0 * chunk;
    gdn_intra_kernel<<<dim3(n_chunks, static_cast<unsigned>(a.Hv)), kThreads, kIntraSmemBytes, stream>>>(
        a, seg_t0, static_cast<int>(chunk), sc);
    PE_CUDA_LAUNCH_CHECK();
    const dim3 grid(static_cast<unsigned>(a.Hv), grid_1d(a.dv, kCols));
    gdn_inter_kernel<<<grid, kThreads, inter_smem, stream>>>(a, seg_t0, static_cast<int>(chunk),
                                                             n_chunks, sc);
    PE_CUDA_LAUNCH_CHECK();
  }
}

void gdn_chunked(const GdnArgs& a, cudaStream_t stream, int64_t chunk) {
  if (a.n <= 0) return;
  check_args(a, chunk);
  const size_t bytes = gdn_chunked_scratch_bytes(a.n, a.Hv, chunk);
  void* scratch = nullptr;
  PE_CUDA_CHECK(cudaMallocAsync(&scratch, bytes, stream));
  gdn_chunked(a, scratch, bytes, stream, chunk);
  PE_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

}  // namespace cuda
}  // namespace pe
