// sample_probs against a brute-force reference and against sample() itself, and spec_verify's
// losslessness: with drafts drawn from q, the tokens it emits have the target's distribution p
// (checked by integrating over the draft and a fine grid of the uniforms, not by sampling noise);
// at temperature 0 it is greedy decoding exactly.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "check.h"
#include "kernels/sampling.h"

using namespace pe;

namespace {

// The sampling distribution in double, straight from the definitions (sampling.h).
std::vector<double> reference_probs(const std::vector<float>& logits, const SamplingConfig& p) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<double> w(V, 0.0);
  if (!(p.temperature > 0.0f) || p.top_k == 1) {
    w[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0;
    return w;
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  for (int64_t i = 0; i < V; ++i) w[i] = std::exp((logits[i] - m) / p.temperature);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;
  double mass_k = 0.0;
  for (int64_t j = 0; j < k; ++j) mass_k += w[order[j]];
  std::vector<bool> keep(V, false);
  double acc = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    keep[order[j]] = true;
    acc += w[order[j]];
    if (p.top_p < 1.0f && acc >= p.top_p * mass_k) break;
  }
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    if (w[i] < p.min_p * 1.0) keep[i] = false;  // the max weight is 1
    if (keep[i]) total += w[i];
  }
  for (int64_t i = 0; i < V; ++i) w[i] = keep[i] ? w[i] / total : 0.0;
  return w;
}

std::vector<float> probs_of(const std::vector<float>& logits, const SamplingConfig& p) {
  std::vector<float> out(logits.size());
  std::vector<int32_t> idx(logits.size());
  cpu::sample_probs(logits.data(), static_cast<int64_t>(logits.size()), p, out.data(), idx.data());
  return out;
}

SamplingConfig config(float t, int k, float top_p, float min_p) {
  SamplingConfig c;
  c.temperature = t;
  c.top_k = k;
  c.top_p = top_p;
  c.min_p = min_p;
  return c;
}

const SamplingConfig kConfigs[] = {config(1.0f, 0, 1.0f, 0.0f), config(0.7f, 0, 0.9f, 0.0f), config(1.3f, 5, 1.0f, 0.0f),
                                   config(1.0f, 4, 0.8f, 0.05f), config(0.0f, 0, 1.0f, 0.0f)};

}  // namespace

TEST(sample_probs_equals_the_reference_distribution) {
  pe_test::Rng rng(11);
  for (const SamplingConfig& c : kConfigs) {
    for (int64_t V : {1, 2, 7, 33, 1000}) {
      const std::vector<float> logits = rng.normals(V, 2.0f);
      const std::vector<float> got = probs_of(logits, c);
      const std::vector<double> want = reference_probs(logits, c);
      for (int64_t i = 0; i < V; ++i) CHECK_NEAR(got[i], want[i], 1e-6);
    }
  }
}

TEST(sample_draws_each_token_with_its_sample_probs_mass) {
  // sample() is an inverse CDF in u: over a fine grid of u, token i's share is probs[i].
  pe_test::Rng rng(12);
  const int64_t V = 9, grid = 200000;
  std::vector<float> w(V);
  std::vector<int32_t> idx(V);
  for (const SamplingConfig& c : kConfigs) {
    const std::vector<float> logits = rng.normals(V, 1.5f);
    const std::vector<float> probs = probs_of(logits, c);
    std::vector<double> share(V, 0.0);
    for (int64_t g = 0; g < grid; ++g) {
      const float u = (static_cast<float>(g) + 0.5f) / grid;
      share[cpu::sample(logits.data(), V, c, u, w.data(), idx.data())] += 1.0 / grid;
    }
    for (int64_t i = 0; i < V; ++i) CHECK_NEAR(share[i], probs[i], 2e-5);
  }
}

TEST(spec_verify_emits_the_target_distribution_whatever_the_draft) {
  // k = 2 drafts drawn from q, N seeded runs: the first emitted token must follow p0 and, where the
  // first draft was accepted, the second emitted token must follow p1 (the row computed after that
  // draft). Bounds: 5 standard deviations of a frequency over N (deterministic seeds).
  pe_test::Rng rng(13);
  const int64_t V = 6, k = 2, N = 400000;
  std::vector<float> residual(V);
  auto draw = [&](const float* probs) {  // inverse CDF
    const double u = rng.uniform();
    double c = 0.0;
    for (int32_t t = 0; t < V; ++t)
      if ((c += probs[t]) > u) return t;
    return static_cast<int32_t>(V - 1);
  };
  for (int trial = 0; trial < 6; ++trial) {
    const SamplingConfig c = kConfigs[trial % 4];
    std::vector<float> p, q;
    for (int64_t r = 0; r <= k; ++r) {
      const auto row = probs_of(rng.normals(V, 1.5f), c);
      p.insert(p.end(), row.begin(), row.end());
    }
    const bool point_mass = trial >= 4;  // an argmax drafter: q one-hot at its draft
    for (int64_t r = 0; r < k; ++r) {
      auto row = probs_of(rng.normals(V, 1.5f), config(1.0f, 0, 1.0f, 0.0f));
      if (point_mass) {
        const int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
        std::fill(row.begin(), row.end(), 0.0f);
        row[best] = 1.0f;
      }
      q.insert(q.end(), row.begin(), row.end());
    }
    std::vector<double> first(V, 0.0), second(V, 0.0);
    double n_accepted_first = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const int32_t drafts[2] = {draw(q.data()), draw(q.data() + V)};
      const float ua[2] = {static_cast<float>(rng.uniform()), static_cast<float>(rng.uniform())};
      const cpu::SpecVerifyResult r = cpu::spec_verify(p.data(), point_mass ? nullptr : q.data(), drafts, k, V, ua,
                                                       static_cast<float>(rng.uniform()), residual.data());
      first[r.n_accepted >= 1 ? drafts[0] : r.next] += 1.0;
      if (r.n_accepted >= 1) {
        n_accepted_first += 1.0;
        second[r.n_accepted >= 2 ? drafts[1] : r.next] += 1.0;
      }
    }
    auto bound = [](double pr, double n) { return 5.0 * std::sqrt(pr * (1.0 - pr) / n) + 1e-4; };
    for (int64_t i = 0; i < V; ++i) CHECK_NEAR(first[i] / N, p[i], bound(p[i], N));
    if (n_accepted_first > 1000)
      for (int64_t i = 0; i < V; ++i)
        CHECK_NEAR(second[i] / n_accepted_first, p[V + i], bound(p[V + i], n_accepted_first));
  }
}

TEST(spec_verify_at_temperature_zero_is_greedy_decoding) {
  pe_test::Rng rng(14);
  const int64_t V = 50, k = 4;
  std::vector<float> residual(V);
  const SamplingConfig greedy = config(0.0f, 0, 1.0f, 0.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> p;
    std::vector<int32_t> argmax;
    for (int64_t r = 0; r <= k; ++r) {
      const auto logits = rng.normals(V);
      argmax.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      const auto row = probs_of(logits, greedy);
      p.insert(p.end(), row.begin(), row.end());
    }
    // Drafts agree with greedy for a random prefix, then one differs.
    const int64_t agree = rng.below(k + 1);
    std::vector<int32_t> drafts(argmax.begin(), argmax.begin() + k);
    if (agree < k) drafts[agree] = (argmax[agree] + 1 + static_cast<int32_t>(rng.below(V - 1))) % V;
    const float ua[4] = {0.999f, 0.5f, 0.0f, 0.9999f};
    const cpu::SpecVerifyResult r = cpu::spec_verify(p.data(), nullptr, drafts.data(), k, V, ua, 0.37f, residual.data());
    CHECK_EQ(r.n_accepted, static_cast<int32_t>(agree));
    CHECK_EQ(r.next, argmax[agree]);
  }
}
