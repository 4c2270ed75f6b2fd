// Quantized GEMV (FP8 e4m3 with block scales, I8 with row scales; n <= 8 tokens) for sm_90: the
// weights stream through shared memory by cp.async.bulk, so the bytes in flight no longer depend on
// registers. Same math as linear_gemv_q.cu (its "swap AB" mma layout, exact fp16 decode, x as an
// fp16 hi + lo pair), same tolerance; that kernel stays the path of every other GPU.
//
// Why: on the H200 the register-pipelined kernel keeps ~4 KB per warp in flight and stalls between
// its loads and its math (FP8 at 38-61 % of the copy bandwidth). An SM needs ~32 KB in flight to
// draw its share of 4.3 TB/s.
//
// A block owns R = 8 T rows and walks their columns in stages of 512 bytes per row:
//   - warp 4 (producer): waits until a ring slot is free, issues one bulk copy per row (R x 512 B)
//     onto the slot's "full" mbarrier, and writes the stage's x as hi/lo fp16 pairs in mma order
//     (and, for FP8, the stage's block scales) next to it;
//   - warps 0..3 (consumers): each takes 128 of the 512 bytes of every row (8 fp8/int8 chunks of
//     16 bytes across its 4 lanes t x 2), decodes them and runs the mmas, then frees the slot.
// kStages slots of R x 576 bytes (64 bytes of padding put rows g and g + 1 of one shared-memory
// phase on different banks). The warps' partial sums meet in shared memory at the end, in warp
// order: the result is deterministic. No cross-block reduction: a block that streams alone on
// its SM draws more bandwidth, so uneven blocks per SM cost little.
#include <atomic>

#include "kernels/cuda/linear_gemv_q.cuh"

namespace pe {
namespace cuda {
namespace {

using namespace gemv_q;

constexpr int kConsumers = 4;
constexpr int kThreads = (kConsumers + 1) * 32;
constexpr int kStages = 4;
constexpr int kStageBytes = 512;                 // bytes of each row per stage
constexpr int kRowPitch = kStageBytes + 64;      // shared-memory pitch of a row in a slot
constexpr int kChunks = kStageBytes / 16;        // 16-byte chunks per row per stage
[[maybe_unused]] constexpr int kStageCols = kStageBytes;           // columns per stage (fp8 / int8: 1 byte each)
constexpr int kXChunkPitch = 4 * 16 + 16;        // a chunk's 4 mma A operands (uint4) + padding
constexpr int kXTokenPitch = kChunks * kXChunkPitch + 64;  // == 64 mod 128: tokens g, g + 1 apart
constexpr int kScaleBytes = 64;                  // FP8: T x 4 block scales per stage (T <= 4)
static_assert(kXTokenPitch % 128 == 64, "x ring token pitch");

template <int T>
__host__ __device__ constexpr int slot_w_bytes() { return 8 * T * kRowPitch; }
__host__ __device__ constexpr int slot_x_bytes(int n) { return n * kXTokenPitch + kScaleBytes; }
template <int T>
__host__ __device__ constexpr int smem_bytes(int n) {
  return 128 + kStages * (slot_w_bytes<T>() + slot_x_bytes(n));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.release.cta.shared::cta.b64 st, [%0];\n}" ::"r"(
                   smem_addr(bar))
               : "memory");
}
// Returns once the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ uint4 lds128(const unsigned char* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// Warp 4: fills slot after slot; all 32 lanes arrive on "full" after their x stores.
template <DType DT, int T>
__device__ void produce(const float* __restrict__ x, int n, const WeightView& w, int seg_per_block,
                        int64_t row0, int n_stages, unsigned char* wring, unsigned char* xring,
                        uint64_t* full, uint64_t* empty) {
  constexpr int R = 8 * T;
  const int lane = threadIdx.x & 31;
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t ncb = (cols + w.block - 1) / w.block;
  const unsigned char* wbase = static_cast<const unsigned char*>(w.data);
  for (int st = 0; st < n_stages; ++st) {
    const int s = st % kStages;
    mbar_wait(&empty[s], ((st / kStages) & 1) ^ 1);
    const int64_t c0 = static_cast<int64_t>(st) * kStageCols;
    const uint32_t bytes = static_cast<uint32_t>(min(static_cast<int64_t>(kStageCols), cols - c0));  // % 16 == 0
    if (lane == 0) mbar_expect_tx(&full[s], bytes * R);
    __syncwarp();
    if (lane < R) {
      const int64_t row = min(row0 + lane, rows - 1);  // clamped rows are computed, not written
      bulk_copy(wring + (s * R + lane) * kRowPitch, wbase + row * cols + c0, bytes, &full[s]);
    }
    unsigned char* xs = xring + s * slot_x_bytes(n);
    for (int j = lane; j < n * kChunks; j += 32) {
      const int token = j / kChunks, ci = j % kChunks;
      const int64_t col = c0 + ci * 16;
      uint32_t xh[8], xl[8];
      x_pairs<DT>(x + token * cols + col, col < cols, xh, xl);
      uint4* dst = reinterpret_cast<uint4*>(xs + token * kXTokenPitch + ci * kXChunkPitch);
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[q] = make_uint4(xh[2 * q], xl[2 * q], xh[2 * q + 1], xl[2 * q + 1]);
    }
    if constexpr (DT == DType::FP8_E4M3) {
      if (lane < T * kConsumers) {  // scale of (row group lane / 4, 128-column segment lane % 4)
        const int r = lane / kConsumers;
        const int seg = st * (kStageCols / 128) + lane % kConsumers;
        const int64_t rb = min(row0 + 8 * r, rows - 1) / w.block;
        const bool valid = static_cast<int64_t>(seg) * 128 < cols;
        reinterpret_cast<float*>(xs + n * kXTokenPitch)[lane] =
            valid ? __ldg(w.block_scale + rb * ncb + seg / seg_per_block) * 256.0f : 0.0f;
      }
    }
    mbar_arrive(&full[s]);
  }
}

// Warps 0..3: 128 bytes of every row per stage (chunk columns 2 warp + c, c = 0, 1).
template <DType DT, int T>
__device__ void consume(int n, int64_t cols, int n_stages, const unsigned char* wring,
                        const unsigned char* xring, uint64_t* full, uint64_t* empty, float (&acc)[T][4]) {
  constexpr int R = 8 * T;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool has_x = g < n;
  for (int st = 0; st < n_stages; ++st) {
    const int s = st % kStages;
    mbar_wait(&full[s], (st / kStages) & 1);
    const unsigned char* ws = wring + s * R * kRowPitch;
    const unsigned char* xs = xring + s * slot_x_bytes(n);
    const int64_t c0 = static_cast<int64_t>(st) * kStageCols;
    float tmp[T][4];
#pragma unroll
    for (int r = 0; r < T; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) tmp[r][e] = 0.0f;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int ci = (2 * warp + c) * 4 + t;
      const bool valid = c0 + ci * 16 < cols;
      uint4 xa[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        xa[q] = has_x && valid ? lds128(xs + g * kXTokenPitch + ci * kXChunkPitch + q * 16) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < T; ++r) {
        const uint4 raw = valid ? lds128(ws + (8 * r + g) * kRowPitch + ci * 16) : make_uint4(0, 0, 0, 0);
        uint32_t wh[8];
        decode_chunk<DT>(raw, 0, wh);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t a[4] = {xa[q].x, xa[q].y, xa[q].z, xa[q].w};
          const uint32_t b[2] = {wh[2 * q], wh[2 * q + 1]};
          mma_16816(tmp[r], a, b);
        }
      }
    }
    if constexpr (DT == DType::FP8_E4M3) {  // this warp's 128 columns are one block-scale segment
      const float* sc = reinterpret_cast<const float*>(xs + n * kXTokenPitch);
#pragma unroll
      for (int r = 0; r < T; ++r) {
        const float b = sc[r * kConsumers + warp];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(tmp[r][e], b, acc[r][e]);
      }
    } else {
#pragma unroll
      for (int r = 0; r < T; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] += tmp[r][e];
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
  }
}
#endif

template <DType DT, int T>
__global__ void __launch_bounds__(kThreads)
    gemv_q_bulk_kernel(const float* __restrict__ x, int n, WeightView w, int seg_per_block,
                       float* __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int R = 8 * T;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStages;
  unsigned char* wring = smem + 128;
  unsigned char* xring = wring + kStages * slot_w_bytes<T>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rows = w.rows, row0 = static_cast<int64_t>(blockIdx.x) * R;
  const int n_stages = static_cast<int>((w.cols + kStageCols - 1) / kStageCols);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 32);  // the producer warp's lanes (+ the bulk copies' bytes)
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  float acc[T][4];
#pragma unroll
  for (int r = 0; r < T; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;
  if (warp == kConsumers)
    produce<DT, T>(x, n, w, seg_per_block, row0, n_stages, wring, xring, full, empty);
  else
    consume<DT, T>(n, w.cols, n_stages, wring, xring, full, empty, acc);
  __syncthreads();  // every copy has landed and been read: the ring is free for the reduction

  // Sum the consumers' column slices; C[token g][rows 2t, 2t+1] = hi (c0, c1) + lo (c2, c3).
  float4* red = reinterpret_cast<float4*>(wring);  // [kConsumers][T][32]
  if (warp < kConsumers)
#pragma unroll
    for (int r = 0; r < T; ++r)
      red[(warp * T + r) * 32 + lane] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  __syncthreads();
  for (int idx = threadIdx.x; idx < T * 64; idx += kThreads) {
    const int r = idx >> 6, l = (idx >> 1) & 31, j = idx & 1;
    float s = 0.0f;
#pragma unroll
    for (int wp = 0; wp < kConsumers; ++wp) {
      const float4 v = red[(wp * T + r) * 32 + l];
      s += j ? v.y + v.w : v.x + v.z;
    }
    const int token = l >> 2;
    const int64_t row = row0 + 8 * r + 2 * (l & 3) + j;
    if (token >= n || row >= rows) continue;
    if constexpr (DT == DType::I8) s *= w.row_scale[row];
    out[static_cast<int64_t>(token) * rows + row] = s;
  }
#else
  __trap();  // never launched: gemv_q_bulk_available() checks for sm_90 code
#endif
}

int current_device() {
  int dev = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev & 63;
}

template <DType DT, int T>
void launch(const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  static std::atomic<uint64_t> attr_set{0};  // per device: the dynamic shared-memory limit raised
  const uint64_t bit = uint64_t(1) << current_device();
  if (!(attr_set.load() & bit)) {
    PE_CUDA_CHECK(cudaFuncSetAttribute(gemv_q_bulk_kernel<DT, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem_bytes<T>(8)));
    attr_set |= bit;
  }
  const int seg_per_block = DT == DType::FP8_E4M3 ? static_cast<int>(w.block / 128) : 1;
  gemv_q_bulk_kernel<DT, T><<<grid_1d(w.rows, 8 * T), kThreads, smem_bytes<T>(n), stream>>>(x, n, w,
                                                                                           seg_per_block, out);
}

std::atomic<bool> g_bulk_enabled{true};

}  // namespace

void linear_gemv_set_bulk_path(bool on) { g_bulk_enabled = on; }

bool linear_gemv_bulk_path_available() {
  static std::atomic<int> state[64];  // per device: 0 not asked yet, 1 available, 2 not
  const int dev = current_device();
  if (state[dev].load() == 0) {
    int major = 0;
    cudaFuncAttributes a{};
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaFuncGetAttributes(&a, gemv_q_bulk_kernel<DType::FP8_E4M3, 2>) == cudaSuccess &&
                    major >= 9 && a.ptxVersion >= 90;  // built for sm_90 (a JIT of compute_75 PTX is not)
    state[dev] = ok ? 1 : 2;
  }
  return state[dev].load() == 1;
}

bool gemv_q_bulk_supported(const float* x, const WeightView& w) {
  if (!g_bulk_enabled || !linear_gemv_bulk_path_available()) return false;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if (!aligned || w.cols % 16 != 0) return false;
  if (w.dtype == DType::FP8_E4M3) return w.block % 128 == 0;
  return w.dtype == DType::I8;
}

void linear_gemv_q_bulk(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  const int nn = static_cast<int>(n);
  const bool tall = w.rows >= 16384;  // 32-row blocks: half the x conversions per weight byte
  if (w.dtype == DType::FP8_E4M3) {
    if (tall) launch<DType::FP8_E4M3, 4>(x, nn, w, out, stream);
    else launch<DType::FP8_E4M3, 2>(x, nn, w, out, stream);
  } else {
    if (tall) launch<DType::I8, 4>(x, nn, w, out, stream);
    else launch<DType::I8, 2>(x, nn, w, out, stream);
  }
}

}  // namespace cuda
}  // namespace pe
