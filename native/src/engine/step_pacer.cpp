#include "engine/step_pacer.h"

#include <algorithm>
#include <cmath>

namespace pe {

StepPacer::StepPacer(const StepCost& cost, double max_step_ms, int64_t chunked_prefill_size, int64_t page_size,
                     std::pair<int64_t, int64_t> slow_rows, int64_t row_tile, bool block_cuts)
    : cost_(cost),
      max_step_s_(max_step_ms * 1e-3),
      chunk_(chunked_prefill_size),
      page_(page_size),
      slow_(slow_rows),
      tile_(row_tile),
      blocks_(block_cuts) {}

double StepPacer::limit_seconds(const StepShape& fixed, int64_t n_past) const {
  if (max_step_s_ > 0.0) return max_step_s_;
  const double fixed_s = cost_.predict_seconds(fixed);
  if (fixed.decode_rows == 0) return fixed_s;  // prompts ending: one block of the long prefill beside them
  auto step_s = [&](int64_t p) { return cost_.predict_seconds(fixed.plus(n_past, p, false)); };
  auto rate = [&](int64_t p) { return static_cast<double>(p) / step_s(p); };
  const double alone_s = cost_.predict_seconds(StepShape{}.plus(n_past, chunk_, false));
  const double wanted_rate = kDerivedPrefillShare * static_cast<double>(chunk_) / alone_s;
  // The least slice that keeps the prefill at the share of its full-chunk rate; out of reach even
  // beside a full chunk, the least that takes the share of the step. Both grow with the slice
  // (the step's fixed part is spread over more tokens): bisection over [1, chunk].
  const bool reachable = alone_s > 0.0 && rate(chunk_) >= wanted_rate;
  auto enough = [&](int64_t p) {
    return reachable ? rate(p) >= wanted_rate : step_s(p) * (1.0 - kDerivedPrefillShare) >= fixed_s;
  };
  int64_t lo = 1, hi = chunk_;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (enough(mid)) hi = mid;
    else lo = mid + 1;
  }
  // Up to where fit would cut, so that its cut does not take the slice below the share: a block
  // boundary; with a row tile, whole tiles of the step's rows (with block cuts, the block boundary
  // at or below their end: fit keeps a tile that full).
  const int64_t rows = fixed.decode_rows + fixed.prefill_tokens;
  int64_t slice = tile_ > 0 ? (rows + lo + tile_ - 1) / tile_ * tile_ - rows
                            : (n_past + lo + page_ - 1) / page_ * page_ - n_past;
  const int64_t block_end = (n_past + slice) / page_ * page_;
  if (tile_ > 0 && blocks_ && block_end > n_past) slice = block_end - n_past;
  return step_s(std::min(chunk_, slice));
}

int64_t StepPacer::fit(const StepShape& so_far, int64_t n_past, int64_t n_max, double limit_s,
                       bool must_progress, bool last) const {
  // Predictions grow with the tokens (the coefficients are >= 0): the most that fit, by bisection.
  const double budget = max_step_s_ > 0.0 ? limit_s / headroom_ : limit_s;
  int64_t lo = 0, hi = n_max;
  while (lo < hi) {
    const int64_t mid = hi - (hi - lo) / 2;
    if (cost_.predict_seconds(so_far.plus(n_past, mid, false)) <= budget) lo = mid;
    else hi = mid - 1;
  }
  int64_t n = lo;
  const int64_t fixed = so_far.decode_rows + so_far.prefill_tokens;
  auto block_floor = [&](int64_t m) { return std::max<int64_t>(0, (n_past + m) / page_ * page_ - n_past); };
  if (tile_ > 0 && (n < n_max || !last)) {
    if (blocks_) n = block_floor(n);
    // A last tile less than kMinTileFill full costs its matmuls' whole tile for few tokens: cut it.
    const int64_t part = (fixed + n) % tile_, whole = n - part;
    if (part > 0 && part < static_cast<int64_t>(kMinTileFill * static_cast<double>(tile_)) && whole > 0) {
      if (!blocks_) n = whole;
      else if (block_floor(whole) > 0) n = block_floor(whole);
    }
  } else if (n < n_max) {
    n = block_floor(n);  // cut at a block boundary
  }
  if (must_progress) n = std::max(n, std::min(n_max, page_ - n_past % page_));
  const int64_t rows = fixed + n;
  if (n > 0 && n < n_max && rows > slow_.first && rows < slow_.second) {  // out of the slow gap (header)
    n = std::min(n_max, n + slow_.second - rows);
    if (n < n_max && tile_ == 0) n = std::min(n_max, (n_past + n + page_ - 1) / page_ * page_ - n_past);
  }
  return n;
}

void StepPacer::observe(double predicted_s, double measured_s) {
  if (!(predicted_s > 0.0) || !(measured_s >= 0.0) || !std::isfinite(measured_s)) return;
  ratios_[n_ratios_++ % kResiduals] = measured_s / predicted_s;
  const size_t n = std::min(n_ratios_, kResiduals);
  sorted_.assign(ratios_.begin(), ratios_.begin() + static_cast<std::ptrdiff_t>(n));
  const size_t k = std::min(n - 1, static_cast<size_t>(std::ceil(0.98 * static_cast<double>(n))) - 1);
  std::nth_element(sorted_.begin(), sorted_.begin() + static_cast<std::ptrdiff_t>(k), sorted_.end());
  headroom_ = std::clamp(sorted_[k], 1.0, kMaxHeadroom);
}

}  // namespace pe
