// Sampling and logprobs on device logits [V] of one sequence; one block of 1024 threads walks the
// vocabulary (a step's sampling is latency bound, and V ~ 250K fits a few passes), except greedy
// over large vocabularies: argmax over blocks, then one warp (argmax_partial_kernel).
//
// sample follows cpu::sample exactly in its semantics: greedy = argmax (lowest id on ties);
// otherwise w_i = exp((l_i - max) / T) (max weight exactly 1), top-k keeps the k first of the
// order (w desc, id asc), top-p the shortest prefix of that order (within top-k) holding
// >= top_p of its mass, min-p keeps w >= min_p; the token is the first kept id, in ascending id
// order, whose cumulative mass exceeds u * total. A kept set is "w > tau, or w == tau and
// id <= last": tau comes from a radix select on the fp32 bits of w (4 passes of 8 bits; counts
// for top-k, double masses for top-p), `last` from a scan over ids. Masses are summed in double,
// in a different order than the CPU: the same token except where u sits within ~1e-12 of a step.
// logprobs: log-sum-exp in double, top-n by n arg-max passes in the order (logit desc, id asc).
// apply_token_mask: one thread per token, -inf outside a grammar's bitmask.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kThreads = 1024;

struct Shared {
  double dred[32];
  float fred[32];
  int ired[32];
  double wscan[32];
  unsigned cnt[256];
  double mass[256];
  int result;
  unsigned prefix;
  double rem;
};

__device__ double block_sum_d(double v, Shared& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.dred[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) r += s.dred[w];
  return r;
}

__device__ float block_max_f(float v, Shared& s) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.fred[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) r = fmaxf(r, s.fred[w]);
  return r;
}

__device__ int block_min_i(int v, Shared& s) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.ired[threadIdx.x >> 5] = v;
  __syncthreads();
  int r = INT_MAX;
  for (int w = 0; w < kThreads / 32; ++w) r = min(r, s.ired[w]);
  return r;
}

// Exclusive prefix sum over threads (thread order = id order of their contiguous chunks).
__device__ double block_exclusive_scan(double v, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) s.wscan[warp] = x;
  __syncthreads();
  double base = 0.0;
  for (int w = 0; w < warp; ++w) base += s.wscan[w];
  return base + x - v;
}

// First id (ascending) where the running sum of weight(i) exceeds target, or -1.
template <class Wt>
__device__ int find_cross(int64_t V, double target, Wt weight, Shared& s) {
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t b = threadIdx.x * chunk, e = min((int64_t)V, b + chunk);
  double local = 0.0;
  for (int64_t i = b; i < e; ++i) local += weight(i);
  const double before = block_exclusive_scan(local, s);
  if (threadIdx.x == 0) s.result = -1;
  __syncthreads();
  if (before <= target && before + local > target) {
    double cum = before;
    for (int64_t i = b; i < e; ++i) {
      cum += weight(i);
      if (cum > target) {
        s.result = static_cast<int>(i);
        break;
      }
    }
  }
  __syncthreads();
  return s.result;
}

// Radix select over the fp32 bits of w (all >= 0) among ids with in_set(i): by count (the
// k-th of the order w desc) when by_mass is false, else by mass (the value where the running mass
// from the top reaches target). Returns tau's bits; s.rem = what is left for the ties at tau.
template <class InSet>
__device__ unsigned radix_select(const float* w, int64_t V, bool by_mass, double target,
                                 InSet in_set, Shared& s) {
  unsigned prefix = 0, mask = 0;
  double rem = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) {
      s.cnt[i] = 0;
      s.mass[i] = 0.0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const unsigned key = __float_as_uint(w[i]);
      if ((key & mask) != prefix || !in_set(i)) continue;
      const unsigned d = (key >> shift) & 255u;
      atomicAdd(&s.cnt[d], 1u);
      if (by_mass) atomicAdd(&s.mass[d], static_cast<double>(w[i]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double acc = 0.0;
      int d = 255;
      for (; d > 0; --d) {
        const double here = by_mass ? s.mass[d] : static_cast<double>(s.cnt[d]);
        if (s.cnt[d] > 0 && acc + here >= rem) break;
        acc += here;
      }
      s.rem = rem - acc;
      s.prefix = prefix | (static_cast<unsigned>(d) << shift);
    }
    __syncthreads();
    prefix = s.prefix;
    rem = s.rem;
    mask |= 255u << shift;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t V, SamplingConfig p, float u, float* w,
                  int32_t* token) {
  __shared__ Shared s;
  const float m = block_max_f([&] {
    float x = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) x = fmaxf(x, logits[i]);
    return x;
  }(), s);
  if (!(p.temperature > 0.0f) || p.top_k == 1 || !isfinite(m)) {
    int first = INT_MAX;
    for (int64_t i = threadIdx.x; i < V; i += kThreads)
      if (logits[i] == m) { first = static_cast<int>(i); break; }
    first = block_min_i(first, s);
    if (threadIdx.x == 0) *token = first == INT_MAX ? 0 : first;
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  double z = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    float x = expf((logits[i] - m) * inv_t);
    if (!(x >= 0.0f)) x = 0.0f;  // NaN logits carry no mass
    w[i] = x;
    z += x;
  }
  z = block_sum_d(z, s);  // also makes w visible to the block
  const float thr = p.min_p > 0.0f ? p.min_p : 0.0f;
  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  // Kept set "w > tau || (w == tau && id <= last)"; tau = 0, last = V: everything.
  float tau = 0.0f;
  int64_t last = V;
  if (k < V) {
    const unsigned bits = radix_select(w, V, false, static_cast<double>(k), [](int64_t) { return true; }, s);
    tau = __uint_as_float(bits);
    const double need = s.rem;  // ties at tau to keep, lowest ids first
    last = find_cross(V, need - 0.5, [&](int64_t i) { return w[i] == tau ? 1.0 : 0.0; }, s);
  }
  if (p.top_p < 1.0f) {
    const float tk = tau;
    const int64_t lk = last;
    auto in_k = [&](int64_t i) { return w[i] > tk || (w[i] == tk && i <= lk); };
    double mass = z;
    if (k < V) {
      double part = 0.0;
      for (int64_t i = threadIdx.x; i < V; i += kThreads) part += in_k(i) ? w[i] : 0.0;
      mass = block_sum_d(part, s);
    }
    const double target = static_cast<double>(fmaxf(p.top_p, 0.0f)) * mass;
    double ties = 1.0;
    if (target <= 0.0) {
      tau = 1.0f;  // the single most likely token
    } else {
      tau = __uint_as_float(radix_select(w, V, true, target, in_k, s));
      ties = tau > 0.0f ? ceil(s.rem / static_cast<double>(tau)) : 1.0;
      if (ties < 1.0) ties = 1.0;
    }
    const float tp = tau;
    last = find_cross(V, ties - 0.5, [&](int64_t i) { return (w[i] == tp && in_k(i)) ? 1.0 : 0.0; }, s);
    // Fewer ties than asked (rounding): all ties at tau that top-k kept.
    if (last < 0) last = tp == tk ? lk : V;
  }
  const float tf = tau;
  const int64_t lf = last;
  auto kept_w = [&](int64_t i) {
    const float x = w[i];
    return (x >= thr && x > 0.0f && (x > tf || (x == tf && i <= lf))) ? static_cast<double>(x) : 0.0;
  };
  double part = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) part += kept_w(i);
  const double total = block_sum_d(part, s);
  int id = find_cross(V, static_cast<double>(u) * total, kept_w, s);
  if (id < 0) {  // rounding: the last kept id
    int hi = -1;
    for (int64_t i = threadIdx.x; i < V; i += kThreads)
      if (kept_w(i) > 0.0) hi = static_cast<int>(i);
    id = -block_min_i(-hi, s);
  }
  if (threadIdx.x == 0) *token = id;
}

__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const float* logits, int64_t V, const int32_t* token_at, int32_t n_top,
                    float* token_logprob, int32_t* top_ids, float* top_logprobs) {
  __shared__ Shared s;
  const int32_t token = *token_at;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) m = fmaxf(m, logits[i]);
  m = block_max_f(m, s);
  double z = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) z += exp(static_cast<double>(logits[i]) - m);
  z = block_sum_d(z, s);
  const double lse = static_cast<double>(m) + log(z);
  if (threadIdx.x == 0 && token_logprob)
    *token_logprob = (token >= 0 && token < V) ? static_cast<float>(logits[token] - lse) : -INFINITY;
  float prev_v = INFINITY;
  int prev_id = -1;
  for (int r = 0; r < n_top; ++r) {
    float best = -INFINITY;
    int best_id = INT_MAX;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float x = logits[i];
      const bool after = x < prev_v || (x == prev_v && i > prev_id);
      if (after && (x > best || best_id == INT_MAX)) { best = x; best_id = static_cast<int>(i); }
    }
    const float bm = block_max_f(best_id == INT_MAX ? -INFINITY : best, s);
    const int bid = block_min_i(best == bm ? best_id : INT_MAX, s);
    if (threadIdx.x == 0) {
      top_ids[r] = bid;
      top_logprobs[r] = static_cast<float>(bm - lse);
    }
    prev_v = bm;
    prev_id = bid;
  }
}

// Greedy over a large vocabulary in two launches instead of one block's walk (the one-block
// sample_kernel takes ~51 us of a 27B decode step on an H200): blocks of 256 threads each find
// the maximum of their slice and its lowest id, then one warp takes the maximum over the blocks
// and the lowest id among the blocks that hold it. The same token as sample_kernel's greedy path:
// fmaxf ignores NaN in both, and the first id equal to the maximum is the lowest over the slices.
constexpr int kArgmaxThreads = 256;
constexpr int64_t kArgmaxSlice = 2048;   // logits per block
constexpr int64_t kArgmaxMinVocab = 4096;  // smaller vocabularies: the one-block kernel
constexpr int kArgmaxMaxBlocks = 256;

// Rows of a run (blockIdx.y): logits row y at logits + y * V, its partials at y * gridDim.x.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* logits, int64_t V, int64_t slice, float* part_max, int* part_id) {
  __shared__ float fred[kArgmaxThreads / 32];
  __shared__ int ired[kArgmaxThreads / 32];
  logits += blockIdx.y * V;
  part_max += blockIdx.y * gridDim.x;
  part_id += blockIdx.y * gridDim.x;
  const int64_t b = blockIdx.x * slice, e = min(V, b + slice);
  float m = -INFINITY;
  for (int64_t i = b + threadIdx.x; i < e; i += kArgmaxThreads) m = fmaxf(m, logits[i]);
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) fred[threadIdx.x >> 5] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kArgmaxThreads / 32; ++w) m = fmaxf(m, fred[w]);
  int first = INT_MAX;
  for (int64_t i = b + threadIdx.x; i < e; i += kArgmaxThreads)
    if (logits[i] == m) { first = static_cast<int>(i); break; }
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  if ((threadIdx.x & 31) == 0) ired[threadIdx.x >> 5] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) first = min(first, ired[w]);
    part_max[blockIdx.x] = m;
    part_id[blockIdx.x] = first;
  }
}

// One warp a row of the run (blockIdx.x).
__global__ void argmax_final_kernel(const float* part_max, const int* part_id, int n_parts, int32_t* token) {
  part_max += blockIdx.x * n_parts;
  part_id += blockIdx.x * n_parts;
  token += blockIdx.x;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n_parts; j += 32) m = fmaxf(m, part_max[j]);
  m = warp_max(m);
  int first = INT_MAX;
  for (int j = threadIdx.x; j < n_parts; j += 32)
    if (part_max[j] == m) first = min(first, part_id[j]);
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  if (threadIdx.x == 0) *token = first == INT_MAX ? 0 : first;
}

__global__ void token_mask_kernel(float* logits, int64_t V, const uint32_t* allowed) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < V; t += (int64_t)gridDim.x * blockDim.x)
    if (!((allowed[t >> 5] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

}  // namespace

void apply_token_mask(float* logits, int64_t V, const uint32_t* allowed, cudaStream_t stream) {
  if (V <= 0 || V > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::apply_token_mask: bad vocabulary size ", V);
  const int blocks = static_cast<int>(std::min<int64_t>((V + 255) / 256, 1024));
  token_mask_kernel<<<blocks, 256, 0, stream>>>(logits, V, allowed);
  PE_CUDA_LAUNCH_CHECK();
}

size_t sample_scratch_bytes(int64_t V) { return static_cast<size_t>(V > 0 ? V : 0) * sizeof(float); }

namespace {

int64_t argmax_slice(int64_t V) { return std::max(kArgmaxSlice, (V + kArgmaxMaxBlocks - 1) / kArgmaxMaxBlocks); }

}  // namespace

bool greedy_two_pass(const SamplingConfig& p, int64_t V) {
  return (!(p.temperature > 0.0f) || p.top_k == 1) && V >= kArgmaxMinVocab && V <= 0x7fffffffLL;
}

int64_t greedy_rows_max(int64_t V, size_t scratch_bytes) {
  if (V < kArgmaxMinVocab || V > 0x7fffffffLL) return 0;
  const int64_t slice = argmax_slice(V), blocks = (V + slice - 1) / slice;
  return std::min<int64_t>(static_cast<int64_t>(scratch_bytes / (8 * static_cast<size_t>(blocks))), 65535);
}

void sample_greedy_rows(const float* logits, int64_t V, int64_t rows, int32_t* token, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  if (rows < 1 || rows > greedy_rows_max(V, scratch_bytes))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::sample_greedy_rows: ", rows, " rows of vocabulary ", V, " with ",
         scratch_bytes, " bytes of scratch (at most ", greedy_rows_max(V, scratch_bytes), ")");
  // The partials in the scratch: 8 bytes a block and row.
  const int64_t slice = argmax_slice(V);
  const int blocks = static_cast<int>((V + slice - 1) / slice);
  float* part_max = static_cast<float*>(scratch);
  int* part_id = reinterpret_cast<int*>(part_max + rows * blocks);
  argmax_partial_kernel<<<dim3(blocks, static_cast<unsigned>(rows)), kArgmaxThreads, 0, stream>>>(logits, V, slice,
                                                                                                 part_max, part_id);
  PE_CUDA_LAUNCH_CHECK();
  argmax_final_kernel<<<static_cast<unsigned>(rows), 32, 0, stream>>>(part_max, part_id, blocks, token);
  PE_CUDA_LAUNCH_CHECK();
}

void sample(const float* logits, int64_t V, const SamplingConfig& p, float u, int32_t* token,
            void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (V <= 0 || V > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::sample: bad vocabulary size ", V);
  if (scratch_bytes < sample_scratch_bytes(V))
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::sample: scratch of ", scratch_bytes, " bytes, needs ",
         sample_scratch_bytes(V));
  if (greedy_two_pass(p, V))  // one row's partials fit the scratch (4 V bytes >= 8 bytes a block)
    return sample_greedy_rows(logits, V, 1, token, scratch, scratch_bytes, stream);
  sample_kernel<<<1, kThreads, 0, stream>>>(logits, V, p, u, static_cast<float*>(scratch), token);
  PE_CUDA_LAUNCH_CHECK();
}

void logprobs(const float* logits, int64_t V, const int32_t* token, int32_t n_top, float* token_logprob,
              int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  if (V <= 0 || V > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::logprobs: bad vocabulary size ", V);
  if (n_top < 0 || n_top > 64) fail(PE_ERR_INVALID_ARGUMENT, "cuda::logprobs: n_top must be 0..64");
  const int32_t n = static_cast<int32_t>(std::min((int64_t)n_top, V));
  logprobs_kernel<<<1, kThreads, 0, stream>>>(logits, V, token, n, token_logprob, top_ids, top_logprobs);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
