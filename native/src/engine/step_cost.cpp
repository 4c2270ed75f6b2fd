#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace pe {

namespace {

constexpr int kF = StepCostModel::kFeatures;
using Matrix = std::array<std::array<double, kF>, kF>;
using Vector = std::array<double, kF>;

// Solves the k x k system m x = v in place (Gaussian elimination, partial pivoting); false when
// it is singular.
bool solve(Matrix& m, Vector& v, int k) {
  for (int c = 0; c < k; ++c) {
    int p = c;
    for (int r = c + 1; r < k; ++r)
      if (std::fabs(m[r][c]) > std::fabs(m[p][c])) p = r;
    if (!(std::fabs(m[p][c]) > 0.0)) return false;
    std::swap(m[p], m[c]);
    std::swap(v[p], v[c]);
    for (int r = c + 1; r < k; ++r) {
      const double f = m[r][c] / m[c][c];
      for (int j = c; j < k; ++j) m[r][j] -= f * m[c][j];
      v[r] -= f * v[c];
    }
  }
  for (int c = k - 1; c >= 0; --c) {
    for (int j = c + 1; j < k; ++j) v[c] -= m[c][j] * v[j];
    v[c] /= m[c][c];
  }
  return true;
}

}  // namespace

StepCostModel::Coefficients nonnegative_least_squares(const Matrix& a, const Vector& b) {
  StepCostModel::Coefficients best{};
  double best_err = 0.0;  // the all-zero solution: error sum t^2 - 0, taken as the reference 0
  for (int subset = 1; subset < (1 << kF); ++subset) {
    int idx[kF], k = 0;
    for (int i = 0; i < kF; ++i)
      if (subset & (1 << i)) idx[k++] = i;
    Matrix m{};
    Vector v{};
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < k; ++c) m[r][c] = a[idx[r]][idx[c]];
      m[r][r] += 1e-9 * a[idx[r]][idx[r]] + 1e-15;
      v[r] = b[idx[r]];
    }
    if (!solve(m, v, k)) continue;
    bool feasible = true;
    double err = 0.0;  // w^T A w - 2 w^T b at the optimum of the subset = -w^T b
    for (int r = 0; r < k; ++r) {
      feasible = feasible && v[r] >= 0.0;
      err -= v[r] * b[idx[r]];
    }
    if (!feasible || err >= best_err) continue;
    best_err = err;
    best = {};
    for (int r = 0; r < k; ++r) best[idx[r]] = v[r];
  }
  return best;
}

StepCostModel::StepCostModel(double forget, int64_t min_spread)
    : forget_(forget), min_spread_(static_cast<double>(min_spread)) {}

StepCostModel::Class StepCostModel::class_of(const StepShape& s) {
  return s.prefill_tokens == 0 ? kDecodeOnly : s.decode_rows == 0 ? kPrefillOnly : kMixed;
}

std::array<double, StepCostModel::kFeatures> StepCostModel::features(const StepShape& s) {
  return {1.0, static_cast<double>(s.decode_rows), s.prefill_tokens > 0 ? 1.0 : 0.0,
          static_cast<double>(s.prefill_tokens), s.attended_pairs * 1e-6};
}

void StepCostModel::observe(const StepShape& s, double seconds, bool overlapped) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds)) return;
  // Relative errors (step_cost.h); an overlapped step measured far shorter than predicted gets
  // the weight of one kWeightCap times shorter.
  double floor = 0.0;
  if (overlapped && ready()) floor = predict_seconds(s) / kWeightCap;
  const double w = 1.0 / std::max({seconds * seconds, floor * floor, 1e-12});
  Sums& sums = classes_[class_of(s)];
  const auto x = features(s);
  for (int i = 0; i < kF; ++i) {
    for (int j = 0; j < kF; ++j) sums.xx[i][j] = forget_ * sums.xx[i][j] + w * x[i] * x[j];
    sums.xy[i] = forget_ * sums.xy[i] + w * x[i] * seconds;
  }
  const double p = static_cast<double>(s.prefill_tokens);
  sums.prefill_min = sums.weight > 0.0 ? std::min(sums.prefill_min, p) : p;
  sums.prefill_max = sums.weight > 0.0 ? std::max(sums.prefill_max, p) : p;
  sums.weight = forget_ * sums.weight + 1.0;
  ++n_observed_;
  refit();
}

void StepCostModel::refit() {
  Matrix a;
  Vector b;
  for (int i = 0; i < kF; ++i) {
    for (int j = 0; j < kF; ++j) {
      a[i][j] = 0.0;
      for (const Sums& c : classes_) a[i][j] += c.xx[i][j];
    }
    b[i] = 0.0;
    for (const Sums& c : classes_) b[i] += c.xy[i];
  }
  // The ridge on prefill_step (step_cost.h): what the data cannot tell apart goes per token.
  a[2][2] *= 1.0 + kStepRidge;
  coef_ = nonnegative_least_squares(a, b);
  // A class's scale f minimizes sum w (f k.x - t)^2 with w = 1 / t^2: f = k.xy / k' xx k.
  for (int c = 0; c < kClasses; ++c) {
    const Sums& sums = classes_[c];
    double num = 0.0, den = 0.0;
    for (int i = 0; i < kF; ++i) {
      num += coef_[i] * sums.xy[i];
      for (int j = 0; j < kF; ++j) den += coef_[i] * sums.xx[i][j] * coef_[j];
    }
    scale_[c] = num > 0.0 && den > 0.0 ? num / den : 1.0;
  }
}

double StepCostModel::predict_seconds(const StepShape& s) const {
  const auto x = features(s);
  double t = 0.0;
  for (int i = 0; i < kF; ++i) t += coef_[i] * x[i];
  return t * scale_[class_of(s)];
}

double StepCostModel::prefill_size(bool largest) const {
  double lo = 0.0, hi = -1.0;
  for (const Sums* c : {&classes_[kPrefillOnly], &classes_[kMixed]}) {
    if (c->weight <= 0.0) continue;
    lo = hi < lo ? c->prefill_min : std::min(lo, c->prefill_min);
    hi = std::max(hi, c->prefill_max);
  }
  return largest ? hi : lo;
}

bool StepCostModel::ready() const {
  const double lo = prefill_size(false), hi = prefill_size(true);
  if (hi < lo) return false;
  return classes_[kDecodeOnly].weight > 0.0 || hi - lo >= min_spread_;
}

}  // namespace pe
