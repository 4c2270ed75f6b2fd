// Sampling, penalties and logprobs on the fp32 logits [V] of one sequence (CPU reference).
//
// uniform_at: u = top 24 bits of splitmix64(seed ^ splitmix64(counter)) * 2^-24, in [0, 1).
// sample: greedy = argmax, lowest id on ties (also top_k == 1). Otherwise
//   p_i ~ exp((l_i - max) / T); top-k keeps the k most likely (ties: lower id first); top-p keeps
//   the smallest most-likely-first prefix whose mass >= top_p of the top-k mass; min-p keeps
//   p_i >= min_p * p_max; the kept tokens are renormalized and the token is the first one, in
//   ascending id order, whose cumulative mass exceeds u * total (design decision: id order, not
//   probability order, so the same u picks the same token whichever filters cut nothing).
//   Top-k/top-p: a bucket histogram of the weights bounds the candidates in O(V), quickselect
//   (on count, then on mass) finds the exact kept set among them; only that set is sorted, by id.
// apply_penalties: repetition penalty once per distinct token of prompt + output (gather, then
//   scatter, as HF does), then -= frequency * count + presence for each distinct output token.
// apply_token_mask: -inf outside the grammar's bitmask, unless it allows no token at all.
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

bool token_mask_allows_any(const uint32_t* allowed, int64_t V) {
  const int64_t n_words = (V + 31) / 32;
  for (int64_t w = 0; w < n_words; ++w) {
    const uint32_t valid = w == n_words - 1 && V % 32 ? (1u << (V % 32)) - 1u : ~0u;
    if (allowed[w] & valid) return true;
  }
  return false;
}

namespace cpu {
namespace {

int32_t argmax(const float* logits, int64_t V) {
  const float m = max_of(logits, V);  // vectorized; then the first id holding it
  for (int64_t i = 0; i < V; ++i)
    if (logits[i] == m) return static_cast<int32_t>(i);
  return 0;  // all NaN
}

// Strict total order "more likely first, then lower id": filters keep prefixes of this order.
inline bool better(const float* w, int32_t a, int32_t b) {
  return w[a] > w[b] || (w[a] == w[b] && a < b);
}

// Inverse CDF in ascending id order over ids[0..n) (ascending), or over all n ids when ids is
// null, skipping those after `last` (if >= 0) in the likelihood order. Weights below thr carry no
// mass.
int32_t pick(const float* w, const int32_t* ids, int64_t n, float thr, int32_t last, float u) {
  if (last >= 0) thr = std::max(thr, w[last]);  // then only ties with `last` need the id test
  auto kept = [&](int32_t i) {
    return w[i] >= thr && w[i] > 0.0f && (last < 0 || w[i] > w[last] || i <= last);
  };
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids ? ids[j] : static_cast<int32_t>(j);
    total += kept(id) ? w[id] : 0.0f;
  }
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int32_t chosen = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids ? ids[j] : static_cast<int32_t>(j);
    if (!kept(id)) continue;
    cum += w[id];
    chosen = id;
    if (cum > target) break;  // falls through to the last kept token only through rounding
  }
  return chosen;
}

// Candidates for top-k / top-p: the ids in (and above) the bucket of the likelihood order where
// the count reaches k (top-k) or the mass reaches target (top-p only). Buckets are the top 12 bits
// of the fp32 weight (monotone in the weight), so one O(V) histogram pass bounds the selection
// and the exact work only sees the candidates. Returns their number, written to idx.
int64_t candidates(const float* w, int64_t V, int64_t k, double target, int32_t* idx) {
  constexpr int kBuckets = 2048;  // weights are in [0, 1]: bucket <= 0x3f8
  int64_t count[kBuckets] = {};
  double mass[kBuckets] = {};
  auto bucket = [w](int64_t i) {
    uint32_t b;
    std::memcpy(&b, &w[i], 4);
    return static_cast<int>(b >> 20);
  };
  for (int64_t i = 0; i < V; ++i) {
    const int b = bucket(i);
    ++count[b];
    mass[b] += w[i];
  }
  int lowest = 0;
  int64_t c = 0;
  double ms = 0.0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    c += count[b];
    ms += mass[b];
    // The margin covers summation-order rounding against the exact selection that follows.
    if (c > 0 && (k < V ? c >= k : ms >= target * (1.0 + 1e-9))) {  // never an empty set
      lowest = b;
      break;
    }
  }
  int64_t n = 0;
  for (int64_t i = 0; i < V; ++i)
    if (bucket(i) >= lowest) idx[n++] = static_cast<int32_t>(i);
  return n;
}

// Smallest n in [1, k] such that the n most likely of idx[0, k) hold >= target mass. Quickselect
// on mass (expected O(k), no sort): invariant top-lo mass (acc) < target <= top-hi mass.
int64_t top_p_count(const float* w, int32_t* idx, int64_t k, double target) {
  auto cmp = [w](int32_t a, int32_t b) { return better(w, a, b); };
  if (target <= 0.0) {  // top_p 0: only the most likely token
    std::iter_swap(idx, std::min_element(idx, idx + k, cmp));
    return 1;
  }
  int64_t lo = 0, hi = k;
  double acc = 0.0;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    std::nth_element(idx + lo, idx + mid, idx + hi, cmp);
    double m = 0.0;
    for (int64_t j = lo; j < mid; ++j) m += w[idx[j]];
    if (acc + m >= target) {
      hi = mid;
    } else {
      acc += m;
      lo = mid;
    }
  }
  return hi;
}

}  // namespace

void apply_token_mask(float* logits, int64_t V, const uint32_t* allowed) {
  if (!token_mask_allows_any(allowed, V)) return;
  for (int64_t t = 0; t < V; ++t)
    if (!((allowed[t >> 5] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

void apply_penalties(float* logits, int64_t V, const SamplingConfig& p, const int32_t* prompt_ids,
                     int64_t n_prompt, const int32_t* out_ids, int64_t n_out) {
  auto valid = [V](int32_t id) { return id >= 0 && id < V; };
  if (p.repetition_applies()) {
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
  if (p.counts_apply() && n_out > 0) {
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

namespace {

// The tokens sample() may draw and their weights: w[i] = exp((l_i - max) / T) (unnormalized), and
// which of them the filters keep. Kept: w >= thr and w > 0, and either every id (ids == nullptr,
// last < 0), or the likelihood-order prefix ending at `last` (ids == nullptr), or the n ids listed
// in ids (ascending).
struct KeptSet {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  float thr = 0.0f;
  int32_t last = -1;
  bool greedy = false;  // temperature 0 (or top_k 1, or no finite logit): the argmax alone
};

KeptSet kept_set(const float* logits, int64_t V, const SamplingConfig& p, float* w, int32_t* idx) {
  KeptSet ks;
  if (!(p.temperature > 0.0f) || p.top_k == 1) {
    ks.greedy = true;
    return ks;
  }
  const float m = max_of(logits, V);
  if (!std::isfinite(m)) {
    ks.greedy = true;
    return ks;
  }
  const float inv_t = 1.0f / p.temperature;
  for (int64_t i = 0; i < V; ++i) {
    w[i] = exp_nonpos((logits[i] - m) * inv_t);  // NaN logits get no mass
  }
  double Z = 0.0;
  for (int64_t i0 = 0; i0 < V; i0 += 4096) {  // float lanes per block, double across blocks
    const int64_t n = std::min<int64_t>(4096, V - i0);
    float part[8] = {};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int l = 0; l < 8; ++l) part[l] += w[i0 + j + l];
    for (; j < n; ++j) part[0] += w[i0 + j];
    for (float x : part) Z += x;
  }
  // The max weight is exactly exp(0) = 1, so min-p's threshold needs no normalization.
  ks.thr = p.min_p > 0.0f ? p.min_p : 0.0f;
  ks.n = V;

  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const bool use_top_p = p.top_p < 1.0f;
  const double top_p = std::max(p.top_p, 0.0f);
  if (k == V && !use_top_p) return ks;

  // Select (never fully sort) the kept prefix of the likelihood order among the candidates.
  auto cmp = [w](int32_t a, int32_t b) { return better(w, a, b); };
  const int64_t n_cand = candidates(w, V, k, top_p * Z, idx);
  const int64_t kk = std::min(k, n_cand);
  if (kk < n_cand) std::nth_element(idx, idx + kk, idx + n_cand, cmp);
  int64_t n_keep = k < V ? kk : n_cand;
  if (use_top_p) {
    double mass = Z;
    if (k < V) {
      mass = 0.0;
      for (int64_t j = 0; j < kk; ++j) mass += w[idx[j]];
    }
    n_keep = top_p_count(w, idx, n_keep, top_p * mass);
  }
  if (n_keep * 8 > V) {  // a large kept set: scan all ids against its least likely member
    int32_t last = idx[0];
    for (int64_t j = 1; j < n_keep; ++j)
      if (better(w, last, idx[j])) last = idx[j];
    ks.last = n_keep < V ? last : -1;
    return ks;
  }
  int64_t n = 0;
  for (int64_t j = 0; j < n_keep; ++j)
    if (w[idx[j]] >= ks.thr) idx[n++] = idx[j];
  std::sort(idx, idx + n);
  ks.ids = idx;
  ks.n = n;
  return ks;
}

}  // namespace

int32_t sample(const float* logits, int64_t V, const SamplingConfig& p, float u, float* w,
               int32_t* idx) {
  if (V <= 0) return 0;
  const KeptSet ks = kept_set(logits, V, p, w, idx);
  if (ks.greedy) return argmax(logits, V);
  const int32_t id = pick(w, ks.ids, ks.n, ks.thr, ks.last, u);
  return id >= 0 ? id : argmax(logits, V);
}

void sample_probs(const float* logits, int64_t V, const SamplingConfig& p, float* probs, int32_t* idx) {
  if (V <= 0) return;
  const KeptSet ks = kept_set(logits, V, p, probs, idx);
  if (ks.greedy) {
    const int32_t best = argmax(logits, V);
    std::fill(probs, probs + V, 0.0f);
    probs[best] = 1.0f;
    return;
  }
  // The same kept test and summation order as pick, then normalized.
  float thr = ks.thr;
  if (ks.last >= 0) thr = std::max(thr, probs[ks.last]);
  const float w_last = ks.last >= 0 ? probs[ks.last] : 0.0f;
  auto kept = [&](int32_t i) {
    return probs[i] >= thr && probs[i] > 0.0f && (ks.last < 0 || probs[i] > w_last || i <= ks.last);
  };
  double total = 0.0;
  if (ks.ids) {
    for (int64_t j = 0; j < ks.n; ++j) total += kept(ks.ids[j]) ? probs[ks.ids[j]] : 0.0f;
    std::vector<float> keep(static_cast<size_t>(ks.n));
    for (int64_t j = 0; j < ks.n; ++j) keep[j] = kept(ks.ids[j]) ? probs[ks.ids[j]] : 0.0f;
    std::fill(probs, probs + V, 0.0f);
    for (int64_t j = 0; j < ks.n; ++j) probs[ks.ids[j]] = static_cast<float>(keep[j] / total);
    return;
  }
  for (int64_t i = 0; i < V; ++i) total += kept(static_cast<int32_t>(i)) ? probs[i] : 0.0f;
  // Decide every id's membership before any weight changes (kept() reads probs[last]).
  for (int64_t i = 0; i < V; ++i)
    if (!kept(static_cast<int32_t>(i))) idx[i] = 0; else idx[i] = 1;
  for (int64_t i = 0; i < V; ++i) probs[i] = idx[i] ? static_cast<float>(probs[i] / total) : 0.0f;
}

SpecVerifyResult spec_verify(const float* p, const float* q, const int32_t* drafts, int64_t k, int64_t V,
                             const float* u_accept, float u_sample, float* residual) {
  SpecVerifyResult r;
  for (int64_t i = 0; i < k; ++i) {
    const float* pi = p + i * V;
    const int32_t x = drafts[i];
    const float px = (x >= 0 && x < V) ? pi[x] : 0.0f;
    const float qx = q ? ((x >= 0 && x < V) ? q[i * V + x] : 0.0f) : 1.0f;
    // Accept x with probability min(1, p(x) / q(x)): u < p / q, i.e. u * q < p (no division).
    if (qx > 0.0f && u_accept[i] * qx < px) {
      ++r.n_accepted;
      continue;
    }
    // Rejected: the next token from the residual max(0, p - q), normalized.
    double total = 0.0;
    for (int64_t t = 0; t < V; ++t) {
      const float qt = q ? q[i * V + t] : (t == x ? 1.0f : 0.0f);
      residual[t] = std::max(0.0f, pi[t] - qt);
      total += residual[t];
    }
    if (!(total > 0.0)) {  // p == q where x was refused only through rounding: draw from p
      std::copy(pi, pi + V, residual);
      total = 1.0;
    }
    r.next = pick(residual, nullptr, V, 0.0f, -1, static_cast<float>(u_sample));
    if (r.next < 0) r.next = x;  // unreachable with total > 0; keeps the token valid
    return r;
  }
  // Every draft accepted: the bonus token from the row after the last draft.
  r.next = pick(p + k * V, nullptr, V, 0.0f, -1, u_sample);
  return r;
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
