// Sampling: uniform_at quality, greedy ties, top-k/top-p/min-p support and exact inverse-CDF
// frequencies on a grid of u values, agreement with a brute-force reference sampler (full sort),
// temperature, seeded determinism; apply_penalties; logprobs.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "check.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/sampling.h"

using namespace pe;

namespace {

struct Sampler {
  std::vector<float> w;
  std::vector<int32_t> idx;
  int32_t operator()(const std::vector<float>& logits, const SamplingConfig& p, float u) {
    w.resize(logits.size());
    idx.resize(logits.size());
    return cpu::sample(logits.data(), static_cast<int64_t>(logits.size()), p, u, w.data(), idx.data());
  }
};

// Counts of each token over N evenly spaced u values in [0, 1).
std::vector<int> histogram(const std::vector<float>& logits, const SamplingConfig& p, int N) {
  Sampler s;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < N; ++i) ++counts[s(logits, p, (i + 0.5f) / N)];
  return counts;
}

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

// Brute force: full sort, filters in the documented order; returns the kept ids (ascending) and
// the weights for an id-ordered inverse CDF.
std::vector<int32_t> ref_kept(const std::vector<float>& logits, const SamplingConfig& p,
                              std::vector<double>& w) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const double m = *std::max_element(logits.begin(), logits.end());
  w.assign(V, 0.0);
  for (int64_t i = 0; i < V; ++i) w[i] = std::exp((logits[i] - m) / p.temperature);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
  int64_t keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  double mass = 0.0;
  for (int64_t j = 0; j < keep; ++j) mass += w[order[j]];
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    int64_t j = 0;
    while (j < keep && cum < p.top_p * mass) cum += w[order[j++]];
    keep = std::max<int64_t>(j, 1);
  }
  std::vector<int32_t> kept;
  for (int64_t j = 0; j < keep; ++j)
    if (w[order[j]] >= p.min_p * w[order[0]]) kept.push_back(order[j]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

int32_t ref_pick(const std::vector<int32_t>& kept, const std::vector<double>& w, float u) {
  double total = 0.0;
  for (int32_t id : kept) total += w[id];
  double cum = 0.0;
  for (int32_t id : kept)
    if ((cum += w[id]) > u * total) return id;
  return kept.back();
}

}  // namespace

TEST(uniform_at_quality) {
  int bins[16] = {};
  double mean = 0.0;
  const int N = 160000;
  for (int i = 0; i < N; ++i) {
    const float u = uniform_at(42, static_cast<uint64_t>(i));
    CHECK(u >= 0.0f && u < 1.0f);
    const float scaled = u * 16777216.0f;
    CHECK(scaled == std::floor(scaled));  // 24-bit mantissa values
    ++bins[static_cast<int>(u * 16)];
    mean += u;
  }
  CHECK_NEAR(mean / N, 0.5, 0.005);
  double chi2 = 0.0;
  for (int b : bins) chi2 += (b - N / 16.0) * (b - N / 16.0) / (N / 16.0);
  CHECK(chi2 < 50.0);  // 15 dof: p ~ 1e-5
  CHECK_EQ(uniform_at(7, 3), uniform_at(7, 3));
  CHECK(uniform_at(7, 3) != uniform_at(8, 3));
  CHECK(uniform_at(7, 3) != uniform_at(7, 4));
  CHECK(uniform_at(0, 0) != uniform_at(1, 1));  // seed ^ counter symmetry is mixed away
}

TEST(exp_nonpos_accuracy) {
  // The vectorizable exp behind the softmax weights: ~2 ulp on [-87, 0], 0 below and for NaN.
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f * static_cast<float>(i) / 200000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::exp_nonpos(x) - want) / want);
  }
  CHECK(worst < 3e-7);
  CHECK_EQ(cpu::exp_nonpos(0.0f), 1.0f);
  CHECK_EQ(cpu::exp_nonpos(-88.0f), 0.0f);
  CHECK_EQ(cpu::exp_nonpos(-INFINITY), 0.0f);
  CHECK_EQ(cpu::exp_nonpos(NAN), 0.0f);
  CHECK_EQ(cpu::exp_nonpos(-NAN), 0.0f);
}

TEST(greedy_and_ties) {
  Sampler s;
  SamplingConfig p;
  CHECK_EQ(s({1, 5, 3, 5, -2}, p, 0.9f), 1);  // tie -> lowest id
  CHECK_EQ(s({-INFINITY, -INFINITY, -1}, p, 0.1f), 2);
  p.temperature = 1.0f;
  p.top_k = 1;
  CHECK_EQ(s({1, 5, 3, 5, -2}, p, 0.99f), 1);
  pe_test::Rng rng(1);
  for (int rep = 0; rep < 50; ++rep) {
    const auto logits = rng.normals(1000, 3.0f);
    SamplingConfig g, k1;
    k1.temperature = 0.7f;
    k1.top_k = 1;
    CHECK_EQ(s(logits, k1, rng.uniform(0.0f, 1.0f)), s(logits, g, 0.5f));
  }
}

TEST(inverse_cdf_frequencies) {
  const auto logits = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingConfig p;
  p.temperature = 1.0f;
  auto h = histogram(logits, p, 1000);
  CHECK_NEAR(h[0], 500, 1);
  CHECK_NEAR(h[1], 300, 1);
  CHECK_NEAR(h[2], 150, 1);
  CHECK_NEAR(h[3], 50, 1);
  p.temperature = 2.0f;  // p ~ sqrt(p): [0.7071, 0.5477, 0.3873, 0.2236] / 1.8657
  h = histogram(logits, p, 10000);
  CHECK_NEAR(h[0], 3790, 2);
  CHECK_NEAR(h[3], 1198, 2);
}

TEST(filters_restrict_support) {
  const auto logits = log_probs({0.5, 0.3, 0.15, 0.05});
  SamplingConfig p;
  p.temperature = 1.0f;
  p.top_p = 0.75f;  // keeps {0, 1}: 0.5 / 0.8 of the mass goes to token 0
  auto h = histogram(logits, p, 1000);
  CHECK_NEAR(h[0], 625, 1);
  CHECK_EQ(h[2] + h[3], 0);
  p.top_p = 1.0f;
  p.min_p = 0.2f;  // keeps p >= 0.1: {0, 1, 2}
  h = histogram(logits, p, 950);
  CHECK_EQ(h[3], 0);
  CHECK_NEAR(h[0], 500, 1);
  p.min_p = 0.0f;
  p.top_k = 3;
  p.top_p = 0.6f;  // top-k mass 0.95, then 0.6 * 0.95 = 0.57 -> {0, 1}
  h = histogram(logits, p, 800);
  CHECK_NEAR(h[0], 500, 1);
  CHECK_NEAR(h[1], 300, 1);
  p.top_k = 2;
  p.top_p = 1.0f;
  h = histogram(logits, p, 800);
  CHECK_EQ(h[2] + h[3], 0);
  p.top_p = 0.0f;  // degenerate: the single most likely token
  h = histogram(logits, p, 100);
  CHECK_EQ(h[0], 100);
}

TEST(matches_reference_sampler) {
  pe_test::Rng rng(2);
  Sampler s;
  int mismatches = 0;
  for (int64_t V : {3, 17, 1000, 50000}) {
    const auto logits = rng.normals(V, 2.5f);
    for (int cfg = 0; cfg < 6; ++cfg) {
      SamplingConfig p;
      p.temperature = cfg == 0 ? 1.0f : 0.6f + 0.3f * cfg;
      p.top_k = (cfg == 1 || cfg == 4) ? 40 : 0;
      p.top_p = (cfg == 2 || cfg == 4 || cfg == 5) ? 0.9f : 1.0f;
      p.min_p = (cfg == 3 || cfg == 5) ? 0.05f : 0.0f;
      std::vector<double> w;
      const std::vector<int32_t> kept = ref_kept(logits, p, w);
      for (int i = 0; i < 200; ++i) {
        const float u = uniform_at(99, static_cast<uint64_t>(i));
        mismatches += s(logits, p, u) != ref_pick(kept, w, u);
      }
    }
  }
  CHECK_EQ(mismatches, 0);
}

TEST(seeded_determinism) {
  pe_test::Rng rng(3);
  const auto logits = rng.normals(5000, 2.0f);
  SamplingConfig p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  Sampler s;
  std::vector<int32_t> a, b, c;
  for (uint64_t i = 0; i < 100; ++i) {
    a.push_back(s(logits, p, uniform_at(5, i)));
    b.push_back(s(logits, p, uniform_at(5, i)));
    c.push_back(s(logits, p, uniform_at(6, i)));
  }
  CHECK(a == b);
  CHECK(a != c);
}

TEST(penalties) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  SamplingConfig p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const int32_t prompt[3] = {0, 1, 0};  // duplicates are penalized once
  const int32_t out[4] = {2, 2, 1, 2};
  cpu::apply_penalties(l.data(), 5, p, prompt, 3, out, 4);
  CHECK_EQ(l[0], 1.0f);                       // 2 / 2
  CHECK_EQ(l[1], -4.0f - 0.5f - 0.25f);       // -2 * 2, then presence + 1 x frequency
  CHECK_EQ(l[2], 0.5f - 0.5f - 0.75f);        // 1 / 2, then presence + 3 x frequency
  CHECK_EQ(l[3], 0.5f);                       // untouched
  CHECK_EQ(l[4], 3.0f);
  // The counts are left clean: a second call applies the same deltas again.
  std::vector<float> l2 = {0, 0, 0, 0, 0};
  SamplingConfig q;
  q.frequency_penalty = 1.0f;
  cpu::apply_penalties(l2.data(), 5, q, nullptr, 0, out, 4);
  cpu::apply_penalties(l2.data(), 5, q, nullptr, 0, out, 4);
  CHECK_EQ(l2[2], -6.0f);
  CHECK_EQ(l2[1], -2.0f);
}

TEST(logprobs_values) {
  pe_test::Rng rng(4);
  for (int64_t V : {1, 5, 1000}) {
    auto logits = rng.normals(V, 4.0f);
    if (V >= 5) logits[3] = logits[1] = 100.0f;  // a tie at the top
    std::vector<int32_t> ids(V);
    std::vector<float> lp(V);
    float tok = 0.0f;
    cpu::logprobs(logits.data(), V, static_cast<int32_t>(V - 1), static_cast<int32_t>(V), &tok,
                  ids.data(), lp.data());
    double total = 0.0, m = -1e300, s = 0.0;
    for (float x : lp) total += std::exp(static_cast<double>(x));
    CHECK_NEAR(total, 1.0, 1e-5);
    for (float x : logits) m = std::max(m, static_cast<double>(x));
    for (float x : logits) s += std::exp(x - m);
    CHECK_NEAR(tok, logits[V - 1] - (m + std::log(s)), 1e-4);
    int bad = 0;
    for (int64_t j = 1; j < V; ++j)
      bad += lp[j] > lp[j - 1] || (lp[j] == lp[j - 1] && logits[ids[j]] == logits[ids[j - 1]] &&
                                   ids[j] < ids[j - 1]);
    CHECK_EQ(bad, 0);
    if (V >= 5) {
      CHECK_EQ(ids[0], 1);
      CHECK_EQ(ids[1], 3);
    }
    std::vector<int32_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t j = 0; j < V; ++j) bad += sorted[j] != j;  // a permutation of all ids
    CHECK_EQ(bad, 0);
  }
  const float l[4] = {1, 3, 2, 3};
  int32_t ids[2];
  float lp[2], tok;
  cpu::logprobs(l, 4, 2, 2, &tok, ids, lp);
  CHECK_EQ(ids[0], 1);
  CHECK_EQ(ids[1], 3);
  CHECK_NEAR(tok, 2.0 - std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0)), 1e-6);
  cpu::logprobs(l, 4, 0, 0, &tok, nullptr, nullptr);  // n_top = 0
  CHECK_NEAR(tok, 1.0 - std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0)), 1e-6);
}

// top_p at (or below) zero keeps only the most likely token, with or without top-k, whatever u.
// (A zero mass target once selected an empty candidate set and returned token 0.)
TEST(top_p_zero_keeps_only_the_most_likely_token) {
  pe_test::Rng rng(3);
  for (int64_t V : {7, 1000, 50000}) {
    std::vector<float> logits = rng.normals(V, 3.0f);
    const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<float> scratch(V);
    std::vector<int32_t> idx(V);
    for (int32_t top_k : {0, 5}) {
      SamplingConfig p;
      p.temperature = 1.0f;
      p.top_p = 0.0f;
      p.top_k = top_k;
      for (int i = 0; i < 20; ++i)
        CHECK_EQ(cpu::sample(logits.data(), V, p, uniform_at(9, i), scratch.data(), idx.data()), best);
    }
  }
}

// A grammar's token mask: masked tokens get -inf, so no sampler configuration picks one, and the
// allowed ones keep their relative odds; a mask with no allowed token leaves the logits alone.
TEST(token_mask_restricts_sampling) {
  pe_test::Rng rng(4);
  for (int64_t V : {1, 19, 32, 33, 99, 989, 8192}) {
    const int64_t n_words = (V + 31) / 32;
    std::vector<uint32_t> mask(static_cast<size_t>(n_words), 0u);
    std::vector<char> allowed(static_cast<size_t>(V), 0);
    for (int64_t t = 0; t < V; ++t)
      if (t == V / 2 || rng.uniform() < 0.1f) {
        allowed[t] = 1;
        mask[t >> 5] |= 1u << (t & 31);
      }
    if (n_words) mask.back() |= V % 32 ? ~((1u << (V % 32)) - 1u) : 0u;  // bits past V are ignored
    CHECK(token_mask_allows_any(mask.data(), V));
    const std::vector<float> logits = rng.normals(V, 3.0f);
    std::vector<float> masked = logits;
    cpu::apply_token_mask(masked.data(), V, mask.data());
    for (int64_t t = 0; t < V; ++t) CHECK(allowed[t] ? masked[t] == logits[t] : std::isinf(masked[t]) && masked[t] < 0);
    Sampler s;
    for (const SamplingConfig& p : {SamplingConfig{0.0f}, SamplingConfig{1.0f}, SamplingConfig{0.7f, 5},
                                    SamplingConfig{1.0f, 0, 0.9f}, SamplingConfig{1.0f, 0, 1.0f, 0.05f}})
      for (int i = 0; i < 50; ++i) CHECK(allowed[s(masked, p, (i + 0.5f) / 50)]);
  }
  std::vector<uint32_t> none(2, 0u);
  none[1] = ~0u << 1;  // only bits past V = 33
  CHECK(!token_mask_allows_any(none.data(), 33));
  std::vector<float> logits(33, 1.5f), same = logits;
  cpu::apply_token_mask(same.data(), 33, none.data());
  CHECK(same == logits);
}
