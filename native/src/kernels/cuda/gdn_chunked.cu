// Gated delta rule, chunked (WY/UT) form for multi-token forwards, fp32 (MODEL_SPEC §3):
// within a chunk of L <= 64 tokens with gamma = cumsum(g):
//   A[i,j] = beta_i (k_i.k_j) e^{gamma_i - gamma_j} (j < i)
//   V' = (I + A)^-1 Y,  Y = beta (V - e^gamma (K S))        (= U - W S of the spec)
//   O  = e^gamma (Q S) + (M . Q K^T) V',  M[i,j] = e^{gamma_i - gamma_j} (j <= i)
//   S  = e^{gamma_L} S + (e^{gamma_L - gamma} K)^T V'
// Every product is linear in the columns of S, V and O, so a block owns (value head, 32 columns)
// and keeps its state slice [dk, 32] in shared memory for the whole sequence; A/P (L x L) and
// Y/V' (L x 32) live in shared memory too; K and Q rows are read from global memory (L1 hits).
// The triangular solve runs per warp on 4 columns (8 lanes share a row's sum), no block barrier.
// Correct first: SIMT fp32, chunks in order inside the block (see NOTES.md for the plan).
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kC = 64, kCols = 32, kThreads = 256, kLdA = kC + 1, kLdY = kCols + 1;

size_t smem_bytes(int64_t dk) {
  return sizeof(float) * (static_cast<size_t>(dk) * kLdY + kC * kLdA + kC * kLdY + 3 * kC);
}

__global__ void __launch_bounds__(kThreads) gdn_chunked_kernel(GdnArgs a, int chunk) {
  extern __shared__ float sm[];
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  float* Ss = sm;                  // [dk][kLdY]
  float* Am = Ss + dk * kLdY;      // [kC][kLdA]: A, then P
  float* Y = Am + kC * kLdA;       // [kC][kLdY]: Y, then V'
  float* gam = Y + kC * kLdY;
  float* bet = gam + kC;
  float* kd = bet + kC;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.x, kh = static_cast<int>(h / (a.Hv / a.Hk));
  const int j0 = blockIdx.y * kCols;
  const int ncols = min(kCols, dv - j0);
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  for (int e = tid; e < dk * kCols; e += kThreads) {
    const int m = e / kCols, c = e % kCols;
    Ss[m * kLdY + c] = c < ncols ? S[static_cast<int64_t>(m) * dv + j0 + c] : 0.0f;
  }
  auto krow = [&](int64_t t) { return a.k + t * a.qk_stride + static_cast<int64_t>(kh) * dk; };
  auto qrow = [&](int64_t t) { return a.q + t * a.qk_stride + static_cast<int64_t>(kh) * dk; };

  for (int64_t t0 = 0; t0 < a.n; t0 += chunk) {
    const int L = static_cast<int>(min((int64_t)chunk, a.n - t0));
    __syncthreads();  // previous chunk done with gam/bet/kd/Am/Y; Ss initialized
    if (tid == 0) {
      float s = 0.0f;
      for (int i = 0; i < L; ++i) {
        s += a.g[(t0 + i) * a.Hv + h];
        gam[i] = s;
        bet[i] = a.beta[(t0 + i) * a.Hv + h];
      }
      for (int i = 0; i < L; ++i) kd[i] = expf(s - gam[i]);
    }
    __syncthreads();
    // A (strictly lower part).
    for (int e = tid; e < L * L; e += kThreads) {
      const int i = e / L, j = e % L;
      if (j >= i) continue;
      const float* ki = krow(t0 + i);
      const float* kj = krow(t0 + j);
      float d = 0.0f;
      for (int m = 0; m < dk; ++m) d = fmaf(ki[m], kj[m], d);
      Am[i * kLdA + j] = bet[i] * expf(gam[i] - gam[j]) * d;
    }
    // Y = beta (V - e^gamma K S).
    for (int e = tid; e < L * kCols; e += kThreads) {
      const int i = e / kCols, c = e % kCols;
      const float* ki = krow(t0 + i);
      float x = 0.0f;
      for (int m = 0; m < dk; ++m) x = fmaf(ki[m], Ss[m * kLdY + c], x);
      const float vv = c < ncols ? a.v[(t0 + i) * a.v_stride + static_cast<int64_t>(h) * dv + j0 + c] : 0.0f;
      Y[i * kLdY + c] = bet[i] * (vv - expf(gam[i]) * x);
    }
    __syncthreads();
    // V' = (I + A)^-1 Y by forward substitution; warp w owns columns 4w .. 4w + 3.
    {
      const int c = warp * 4 + (lane & 3), part = lane >> 2;
      for (int i = 1; i < L; ++i) {
        float s = 0.0f;
        for (int m = part; m < i; m += 8) s = fmaf(Am[i * kLdA + m], Y[m * kLdY + c], s);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        if (part == 0) Y[i * kLdY + c] -= s;
        __syncwarp();
      }
    }
    __syncthreads();
    // P = M . Q K^T (into Am, diagonal included).
    for (int e = tid; e < L * L; e += kThreads) {
      const int i = e / L, j = e % L;
      if (j > i) continue;
      const float* qi = qrow(t0 + i);
      const float* kj = krow(t0 + j);
      float d = 0.0f;
      for (int m = 0; m < dk; ++m) d = fmaf(qi[m], kj[m], d);
      Am[i * kLdA + j] = expf(gam[i] - gam[j]) * d;
    }
    __syncthreads();
    // O = e^gamma (Q S) + P V'.
    for (int e = tid; e < L * kCols; e += kThreads) {
      const int i = e / kCols, c = e % kCols;
      const float* qi = qrow(t0 + i);
      float x = 0.0f;
      for (int m = 0; m < dk; ++m) x = fmaf(qi[m], Ss[m * kLdY + c], x);
      float o = expf(gam[i]) * x;
      for (int j = 0; j <= i; ++j) o = fmaf(Am[i * kLdA + j], Y[j * kLdY + c], o);
      if (c < ncols) a.out[((t0 + i) * a.Hv + h) * dv + j0 + c] = o;
    }
    __syncthreads();
    // S = e^{gamma_L} S + (e^{gamma_L - gamma} K)^T V'.
    const float eg = expf(gam[L - 1]);
    for (int e = tid; e < dk * kCols; e += kThreads) {
      const int m = e / kCols, c = e % kCols;
      float s = eg * Ss[m * kLdY + c];
      for (int j = 0; j < L; ++j) s = fmaf(kd[j] * krow(t0 + j)[m], Y[j * kLdY + c], s);
      Ss[m * kLdY + c] = s;
    }
  }
  __syncthreads();
  for (int e = tid; e < dk * kCols; e += kThreads) {
    const int m = e / kCols, c = e % kCols;
    if (c < ncols) S[static_cast<int64_t>(m) * dv + j0 + c] = Ss[m * kLdY + c];
  }
}

}  // namespace

void gdn_chunked(const GdnArgs& a, cudaStream_t stream, int64_t chunk) {
  if (a.n <= 0) return;
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chunked: Hv must be a multiple of Hk");
  if (chunk < 1 || chunk > kC) fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_chunked: chunk must be 1..64");
  if (a.dk <= 0 || a.dk > 256 || a.dv <= 0)
    fail(PE_ERR_UNSUPPORTED, "cuda::gdn_chunked: dk must be 1..256");
  const size_t smem = smem_bytes(a.dk);
  if (smem > 48 * 1024)
    PE_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(a.Hv), grid_1d(a.dv, kCols));
  gdn_chunked_kernel<<<grid, kThreads, smem, stream>>>(a, static_cast<int>(chunk));
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
