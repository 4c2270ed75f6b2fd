// Stream-K in the quantized GEMV (linear_gemv_q.cu): how a launch's grid and split are chosen.
#pragma once
#include <algorithm>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear_gemv_q.cuh"

namespace pe {
namespace cuda {
namespace gemv_q {

// Stream-K: where the row blocks leave SMs idle (fewer blocks than the GPU holds at once) and a
// row has GemvTuning::stream_k_min_steps column steps or more, or where they take more than one
// wave and leave the last one short (GemvTuning::stream_k_balance_pct), the grid is the GPU's
// block capacity and block b takes units [b U / nb, (b + 1) U / nb) of the U = row blocks x column
// steps (rounded down to a multiple of GemvTuning::stream_k_quantum; balance: 8, each warp of a
// part the same steps), in row-block order: first and last row blocks may be parts. A row
// block whose steps are split over blocks is summed from the partial sums in kPartFloats slots, in
// block order (deterministic, and the same partition for every token count): where the whole grid
// is resident at once, by its first block at its end, which waits for the later blocks' parts
// (GemvTuning::stream_k_spin); else by the last of them to finish (a counter per row block).
// Without stream-K the same code runs one whole row block per block. The scratch is per device and
// static: the GEMV calls of a device run in stream order (every launch of the library is on
// cuda::stream()), and the finishers reset the counters and zero the slots they read.
constexpr int kMaxStreamBlocks = 1024;
constexpr int kMaxStreamRowBlocks = 8192, kPartFloats = 256;  // the counters; T * 64 at T = 4

// A launch's split: U units, block boundaries on multiples of q (n_it: a row block per block; or the
// stream-K quantum), quanta = U / q. A parameter: computed in the kernel it would stay live
// through the loop, whose loads then go out later (steady FP8 93 instead of 105 % of copy).
struct Split {
  int64_t units, quanta;
  int q;
};

__device__ __forceinline__ int64_t unit_start(int64_t b, const Split& sp, int64_t nb) {
  return b >= nb ? sp.units : b * sp.quanta / nb * sp.q;
}

// The block whose units hold unit u (nb <= quanta: every block has at least one).
__device__ __forceinline__ int64_t block_of_unit(int64_t u, const Split& sp, int64_t nb) {
  int64_t b = u * nb / sp.units;
  while (b + 1 < nb && unit_start(b + 1, sp, nb) <= u) ++b;
  while (b > 0 && unit_start(b, sp, nb) > u) --b;
  return b;
}

// Columns per column step at T row groups per warp, steps per row, row blocks of a launch.
template <DType DT, int T>
__host__ __device__ constexpr int step_cols() { return 4 * (8 / T) * values_per_chunk<DT>(); }
template <DType DT, int T>
int64_t steps_of(const WeightView& w) { return (w.cols + step_cols<DT, T>() - 1) / step_cols<DT, T>(); }
template <DType DT, int T>
int64_t row_blocks_of(const WeightView& w, const GemvEpilogue& ep) {
  return ep.inter > 0 ? grid_1d(ep.inter, 4 * T) : grid_1d(w.rows, 8 * T);
}

// A launch's grid and split: fill (slots left empty, rows of stream_k_min_steps steps or more),
// balance (a short last wave, stream_k_balance_pct) or one row block per block; slots: the GPU's
// blocks at the kernel's register budget.
struct Plan {
  int64_t grid, row_blocks;
  Split sp;
};
inline Plan plan_grid(const GemvTuning& tn, int64_t row_blocks, int64_t n_it, int64_t slots, bool swiglu) {
  const int64_t sk_grid = std::min<int64_t>({slots, row_blocks * n_it / kWarps, kMaxStreamBlocks});
  const bool fill = !swiglu && tn.stream_k && n_it >= std::max(tn.stream_k_min_steps, 1) && row_blocks < sk_grid;
  const int64_t last_wave = row_blocks % slots;  // row blocks in the last wave
  const bool balance = tn.stream_k && row_blocks > slots && last_wave != 0 &&
                       last_wave * 100 <= tn.stream_k_balance_pct * slots && row_blocks <= kMaxStreamRowBlocks &&
                       sk_grid == slots;
  Plan p;
  p.grid = fill || balance ? sk_grid : row_blocks;
  p.row_blocks = row_blocks;
  p.sp.units = row_blocks * n_it;
  const int q = tn.stream_k_quantum > 0 ? tn.stream_k_quantum : balance ? kWarps : 1;
  p.sp.q = p.grid == row_blocks ? static_cast<int>(n_it) : static_cast<int>(std::min<int64_t>(q, p.sp.units / p.grid));
  p.sp.quanta = p.sp.units / p.sp.q;
  return p;
}

}  // namespace gemv_q
}  // namespace cuda
}  // namespace pe
