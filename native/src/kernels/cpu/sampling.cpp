// Sampling, penalties and logprobs on the fp32 logits [V] of one sequence (CPU reference).
//
// uniform_at: u = top 24 bits of splitmix64(seed ^ splitmix64(counter)) * 2^-24, in [0, 1).
// sample: greedy = argmax, lowest id on ties (also top_k == 1). Otherwise
//   p_i ~ exp((l_i - max) / T); top-k keeps the k most likely (ties: lower id first); top-p keeps
//   the smallest most-likely-first prefix whose mass >= top_p of the top-k mass; min-p keeps
//   p_i >= min_p * p_max; the kept tokens are renormalized and the token is the first one, in
//   ascending id order, whose cumulative mass exceeds u * total (design decision: id order, not
//   probability order, so the same u picks the same token whichever filters cut nothing).
//   Top-k/top-p only partially sort: the sorted prefix grows x8 until it holds top_p of the mass.
// apply_penalties: repetition penalty once per distinct token of prompt + output (gather, then
//   scatter, as HF does), then -= frequency * count + presence for each distinct output token.
// logprobs: log-sum-exp in double; top-n by insertion into the caller's arrays (n is small).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_util.h"
#include "kernels/sampling.h"

namespace pe {
namespace {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

float uniform_at(uint64_t seed, uint64_t counter) {
  const uint64_t h = splitmix64(seed ^ splitmix64(counter));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

namespace cpu {
namespace {

int32_t argmax(const float* logits, int64_t V) {
  int64_t best = 0;
  float bv = -INFINITY;
  bool found = false;
  for (int64_t i = 0; i < V; ++i) {
    if (logits[i] > bv || (!found && logits[i] == bv)) {  // -inf everywhere still picks id 0
      bv = logits[i];
      best = i;
      found = true;
    }
  }
  return static_cast<int32_t>(best);
}

// Inverse CDF over ids[0..n) (ascending) or, when ids is null, over all V ids; weights w >= thr.
int32_t pick(const float* w, const int32_t* ids, int64_t n, float thr, float u) {
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float x = w[ids ? ids[j] : j];
    if (x >= thr) total += x;
  }
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids ? ids[j] : static_cast<int32_t>(j);
    const float x = w[id];
    if (x < thr || x <= 0.0f) continue;
    cum += x;
    last = id;
    if (cum > target) return id;
  }
  return last;  // only reached through rounding at u close to 1
}

}  // namespace

void apply_penalties(float* logits, int64_t V, const SamplingConfig& p, const int32_t* prompt_ids,
                     int64_t n_prompt, const int32_t* out_ids, int64_t n_out) {
  auto valid = [V](int32_t id) { return id >= 0 && id < V; };
  if (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) {
    const float rp = p.repetition_penalty;
    const int64_t n_all = n_prompt + n_out;
    float* orig = scratch(0, static_cast<size_t>(std::max<int64_t>(n_all, 1)));
    auto id_at = [&](int64_t j) { return j < n_prompt ? prompt_ids[j] : out_ids[j - n_prompt]; };
    for (int64_t j = 0; j < n_all; ++j) orig[j] = valid(id_at(j)) ? logits[id_at(j)] : 0.0f;
    for (int64_t j = 0; j < n_all; ++j) {
      if (!valid(id_at(j))) continue;
      logits[id_at(j)] = orig[j] > 0.0f ? orig[j] / rp : orig[j] * rp;
    }
  }
  if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && n_out > 0) {
    thread_local std::vector<int32_t> counts;  // all zero between calls
    if (static_cast<int64_t>(counts.size()) < V) counts.resize(static_cast<size_t>(V), 0);
    for (int64_t j = 0; j < n_out; ++j)
      if (valid(out_ids[j])) ++counts[out_ids[j]];
    for (int64_t j = 0; j < n_out; ++j) {
      const int32_t id = out_ids[j];
      if (!valid(id) || counts[id] == 0) continue;
      logits[id] -= p.frequency_penalty * static_cast<float>(counts[id]) + p.presence_penalty;
      counts[id] = 0;
    }
  }
}

int32_t sample(const float* logits, int64_t V, const SamplingConfig& p, float u, float* w,
               int32_t* idx) {
  if (V <= 0) return 0;
  if (!(p.temperature > 0.0f) || p.top_k == 1) return argmax(logits, V);
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, logits[i]);
  if (!std::isfinite(m)) return argmax(logits, V);
  const float inv_t = 1.0f / p.temperature;
  for (int64_t i = 0; i < V; ++i) {
    const float x = std::exp((logits[i] - m) * inv_t);
    w[i] = x >= 0.0f ? x : 0.0f;  // NaN logits get no mass
  }
  // The max weight is exactly exp(0) = 1, so min-p's threshold needs no normalization.
  const float thr = p.min_p > 0.0f ? p.min_p : 0.0f;

  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const bool use_top_p = p.top_p < 1.0f;
  if (k == V && !use_top_p) return pick(w, nullptr, V, thr, u);

  auto better = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  std::iota(idx, idx + V, 0);
  if (k < V) std::nth_element(idx, idx + k, idx + V, better);
  int64_t n_keep = k;
  if (use_top_p) {
    double mass = 0.0;
    for (int64_t j = 0; j < k; ++j) mass += w[idx[j]];
    const double target = static_cast<double>(std::max(p.top_p, 0.0f)) * mass;
    for (int64_t sorted = std::min<int64_t>(k, 64);; sorted = std::min(k, sorted * 8)) {
      std::partial_sort(idx, idx + sorted, idx + k, better);
      double cum = 0.0;
      int64_t j = 0;
      while (j < sorted && cum < target) cum += w[idx[j++]];
      if (cum >= target || sorted == k) {
        n_keep = std::max<int64_t>(j, 1);
        break;
      }
    }
  }
  int64_t n = 0;
  for (int64_t j = 0; j < n_keep; ++j)
    if (w[idx[j]] >= thr) idx[n++] = idx[j];
  std::sort(idx, idx + n);
  const int32_t id = pick(w, idx, n, thr, u);
  return id >= 0 ? id : argmax(logits, V);
}

void logprobs(const float* logits, int64_t V, int32_t token, int32_t n_top, float* token_logprob,
              int32_t* top_ids, float* top_logprobs) {
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, logits[i]);
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  const double lse = static_cast<double>(m) + std::log(s);
  if (token_logprob)
    *token_logprob = (token >= 0 && token < V) ? static_cast<float>(logits[token] - lse) : -INFINITY;

  const int64_t n = std::min<int64_t>(std::max<int32_t>(n_top, 0), V);
  if (n == 0) return;
  int64_t count = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float x = logits[i];
    // Strictly greater than the current n-th: an equal later id never displaces a lower one.
    if (count == n && !(x > logits[top_ids[n - 1]])) continue;
    int64_t pos = count < n ? count++ : n - 1;
    while (pos > 0 && x > logits[top_ids[pos - 1]]) {
      top_ids[pos] = top_ids[pos - 1];
      --pos;
    }
    top_ids[pos] = static_cast<int32_t>(i);
  }
  for (int64_t j = 0; j < n; ++j)
    top_logprobs[j] = static_cast<float>(logits[top_ids[j]] - lse);
}

}  // namespace cpu
}  // namespace pe
