// The step-cost model: how long one engine step takes as a function of what it computes, learned
// from the steps the engine runs (one model per engine, so per device; with tensor parallel, rank
// 0 times whole steps, all-reduces included). The scheduler uses it to size the prefill share of a
// step to a time limit (step_pacer.h).
//
//   t = base + decode_row * decode_rows + prefill_step * (prefill_tokens > 0)
//            + prefill_token * prefill_tokens + attention * attended_pairs / 1e6
//
// decode_rows: tokens of requests that are decoding. One each; a speculative verify of 1 + k
// tokens counts 1 + k rows (its forward is the same rows of the same matmuls), and a speculating
// engine times each step with its proposer's turn after it (drafting grows with the same rows), so
// a speculative decoding loop is paced as any other. prefill_step: what a step pays for holding
// prefill at all (the matmuls of many rows take another path than a decode step's, the GDN
// chunked scan and the prefill attention have their own launches and passes): it is what makes a
// small prefill slice cost more per token than a full chunk. prefill_tokens: prompt tokens (or
// tokens recomputed after a preemption). attended_pairs: (query, key) pairs of the causal
// attention, summed over the step's rows: what grows with context depth.
//
// Fit: least squares of relative errors with non-negative coefficients (a step never gets cheaper
// by adding work) over the steps seen, with exponential forgetting, so the model follows the
// device (clocks, other load) as it runs. Design decisions:
// (0) prefill_step carries a ridge (kStepRidge of its own weight): while nearly every prefill step
//     has one size (a long prompt's full chunks: then prefill_step's column is prefill_tokens'
//     times a constant), what the data cannot tell apart counts per token. The pacer then cuts
//     smaller slices, whose times separate the two. Counted per step instead (as an unbiased fit
//     may pick: the error is the same), a slice would look as costly as a full chunk, pacing would
//     keep full chunks and the model would never see the slices that correct it (measured: a
//     27B prefill on an H100 fitted 52 ms a step and 0 a token, steps of ~100 ms).
// (1) Decode-only, prefill-only and mixed steps are three classes, and an observation fades only
//     as steps of its own class arrive: a long stretch of pure decoding must not erase what
//     prefill steps taught, nor a long stretch of paced steps (small prefill slices beside decode
//     rows) what full chunks and decode-only steps cost: the derived step limit compares a slice's
//     rate with a full chunk's (step_pacer.h).
// (2) The errors are relative (timing noise grows with the step, and a decode step's time matters
//     as much as a long chunk's), which also bounds what a stalled step (the host descheduled) can
//     do to the fit. Only an overlapped step (engine.h) can be measured shorter than it took --
//     when the host read the step before it late, the device was already working on it -- and its
//     weight is capped (kWeightCap).
// (3) The linear form does not fit every regime at once (a small prefill slice beside decode rows
//     can cost more per token than a full chunk: matmuls of fewer rows run less efficiently), so
//     each class carries a scale, its measured / fitted times by least squares of relative errors,
//     and a prediction is the fitted time times the scale of the shape's class: the coefficients
//     give the structure (depth, rows, tokens), the scale the regime's level.
#pragma once
#include <array>
#include <cstdint>

namespace pe {

struct StepShape {
  int64_t decode_rows = 0;
  int64_t prefill_tokens = 0;
  double attended_pairs = 0.0;

  // A chunk of n rows after n_past tokens of its sequence.
  void add(int64_t n_past, int64_t n, bool is_decode) {
    (is_decode ? decode_rows : prefill_tokens) += n;
    attended_pairs += static_cast<double>(n) * static_cast<double>(n_past) +
                      static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
  }
  StepShape plus(int64_t n_past, int64_t n, bool is_decode) const {
    StepShape s = *this;
    s.add(n_past, n, is_decode);
    return s;
  }
};

// What the pacer needs of a cost model (tests substitute a fixed one).
class StepCost {
 public:
  virtual ~StepCost() = default;
  // Predicted seconds of a step of this shape.
  virtual double predict_seconds(const StepShape& s) const = 0;
  // True once predictions rest on measurements: prefill steps, and a decode-only step or prefill
  // steps of two sizes (what separates a step's base cost from its per-token cost).
  virtual bool ready() const = 0;
};

class StepCostModel : public StepCost {
 public:
  // base, decode rows, prefill step, prefill tokens, attended pairs / 1e6
  static constexpr int kFeatures = 5;
  static constexpr double kWeightCap = 2.0;
  static constexpr double kStepRidge = 0.02;
  using Coefficients = std::array<double, kFeatures>;

  // forget: weight kept per later observation of the same class. min_spread: how far apart (in
  // prefill tokens) two prefill steps must be for the prefill-only data to separate the base cost
  // from the per-token cost when no decode-only step has been seen.
  explicit StepCostModel(double forget = 0.98, int64_t min_spread = 16);

  // overlapped: the step was queued before the previous one was read (its time may be short).
  void observe(const StepShape& s, double seconds, bool overlapped = false);
  double predict_seconds(const StepShape& s) const override;
  bool ready() const override;

  // Seconds: base, per decode row, per step with prefill, per prefill token, per million pairs.
  const Coefficients& coefficients() const { return coef_; }
  // Scales of decode-only, prefill-only and mixed steps (1 for a class not seen).
  const std::array<double, 3>& class_scales() const { return scale_; }
  int64_t n_observed() const { return n_observed_; }

 private:
  struct Sums {
    std::array<std::array<double, kFeatures>, kFeatures> xx{};  // sum of w x x^T
    std::array<double, kFeatures> xy{};                         // sum of w x t
    double prefill_min = 0.0, prefill_max = 0.0;                // prefill sizes in this class
    double weight = 0.0;
  };
  enum Class { kDecodeOnly, kPrefillOnly, kMixed, kClasses };
  static Class class_of(const StepShape& s);
  // The least / largest prefill tokens of a step seen (largest < least: none seen).
  double prefill_size(bool largest) const;
  static std::array<double, kFeatures> features(const StepShape& s);
  void refit();

  double forget_;
  double min_spread_;
  std::array<Sums, kClasses> classes_;
  Coefficients coef_{};
  std::array<double, kClasses> scale_{1.0, 1.0, 1.0};
  int64_t n_observed_ = 0;
};

// Non-negative least squares of the normal equations A w = b for a handful of unknowns: every
// subset of free coefficients is solved (others held at 0) and the feasible one of least error
// wins: exact, and 2^kFeatures = 32 small solves. A tiny ridge keeps unseen directions at 0.
StepCostModel::Coefficients nonnegative_least_squares(
    const std::array<std::array<double, StepCostModel::kFeatures>, StepCostModel::kFeatures>& a,
    const std::array<double, StepCostModel::kFeatures>& b);

}  // namespace pe
