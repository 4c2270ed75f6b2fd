#include "engine/step_pacer.h"

#include <algorithm>
#include <limits>

namespace pe {

StepPacer::StepPacer(const StepCost& cost, double max_step_ms, int64_t chunked_prefill_size, int64_t page_size)
    : cost_(cost), max_step_s_(max_step_ms * 1e-3), chunk_(chunked_prefill_size), page_(page_size) {}

double StepPacer::limit_seconds(const StepShape& fixed, int64_t n_past) const {
  if (max_step_s_ > 0.0) return max_step_s_;
  const double fixed_s = cost_.predict_seconds(fixed);
  if (fixed.decode_rows == 0) return fixed_s;  // prompts ending: one block of the long prefill beside them
  // The least whole blocks of prefill that take kDerivedPrefillShare of the step, by bisection
  // over [1, chunk] (predictions grow with the tokens).
  const double target_s = fixed_s / (1.0 - kDerivedPrefillShare);
  int64_t lo = 1, hi = chunk_;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cost_.predict_seconds(fixed.plus(n_past, mid, false)) >= target_s) hi = mid;
    else lo = mid + 1;
  }
  // Up to a block boundary, so that fit() cutting the slice there does not take it below the share.
  const int64_t slice = std::min(chunk_, (n_past + lo + page_ - 1) / page_ * page_ - n_past);
  return cost_.predict_seconds(fixed.plus(n_past, slice, false));
}

int64_t StepPacer::fit(const StepShape& so_far, int64_t n_past, int64_t n_max, double limit_s,
                       bool must_progress) const {
  // Predictions grow with the tokens (the coefficients are >= 0): the most that fit, by bisection.
  int64_t lo = 0, hi = n_max;
  while (lo < hi) {
    const int64_t mid = hi - (hi - lo) / 2;
    if (cost_.predict_seconds(so_far.plus(n_past, mid, false)) <= limit_s) lo = mid;
    else hi = mid - 1;
  }
  int64_t n = lo;
  if (n < n_max) n = std::max<int64_t>(0, (n_past + n) / page_ * page_ - n_past);  // cut at a block boundary
  if (must_progress) n = std::max(n, std::min(n_max, page_ - n_past % page_));
  return n;
}

}  // namespace pe
