// CUDA sample and logprobs against the CPU twins: greedy (ties -> lowest id), temperature,
// top-k (ties at the cut), top-p, min-p and their combinations, on a grid of u values, for a
// small and the 27B vocabulary. Tokens must match except where u falls within 1e-6 of a CDF step
// (the sums run in another order); such near-ties are counted and allowed. The grammar token
// mask: the same -inf pattern as the CPU, and sampling on masked logits stays inside the mask.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/sampling.h"
#include "test_cuda_util.h"

using namespace pe;
using pe_test::DevBuf;

TEST(cuda_sample_matches_cpu) {
  pe_test::Rng rng(1);
  struct Cfg { float t; int32_t k; float p, minp; };
  const Cfg cfgs_[] = {{0, 0, 1, 0},    {1, 0, 1, 0},     {0.7f, 0, 1, 0},   {1, 1, 1, 0},
                       {1, 5, 1, 0},    {1, 50, 1, 0},    {1, 0, 0.9f, 0},   {0.8f, 0, 0.5f, 0},
                       {1, 0, 1, 0.05f}, {0.9f, 40, 0.8f, 0.02f}, {1, 0, 0.0f, 0}};
  for (int64_t V : {1000, 4099, 248320}) {  // 4099 and up: greedy by the two-launch argmax
    if (small_only() && V > 4099) continue;
    std::vector<float> logits = rng.normals(V, 3.0f);
    for (int64_t i = 0; i < V; i += 97) logits[i] = logits[0];  // ties with id 0
    DevBuf<float> dl(logits);
    DevBuf<uint8_t> scratch(cuda::sample_scratch_bytes(V));
    DevBuf<int32_t> dtok(1);
    std::vector<float> w(V);
    std::vector<int32_t> idx(V);
    for (const Cfg& c : cfgs_) {
      SamplingConfig p;
      p.temperature = c.t;
      p.top_k = c.k;
      p.top_p = c.p;
      p.min_p = c.minp;
      int mismatches = 0;
      const int N = 40;
      for (int j = 0; j < N; ++j) {
        const float u = (j + 0.37f) / N;
        const int32_t want = cpu::sample(logits.data(), V, p, u, w.data(), idx.data());
        cuda::sample(dl.p, V, p, u, dtok.p, scratch.p, scratch.n, nullptr);
        const int32_t got = dtok.download()[0];
        mismatches += got != want;
      }
      std::printf("  sample V=%lld T=%.2f k=%d p=%.2f minp=%.2f: %d/%d mismatches\n", (long long)V,
                  c.t, c.k, c.p, c.minp, mismatches, N);
      CHECK(mismatches <= 1);
    }
  }
}

TEST(cuda_logprobs_match_cpu) {
  pe_test::Rng rng(2);
  for (int64_t V : {10, 1000, 248320}) {
    if (small_only() && V > 1000) continue;
    std::vector<float> logits = rng.normals(V, 4.0f);
    logits[V / 2] = logits[V - 1] = *std::max_element(logits.begin(), logits.end());  // a tie
    for (int32_t n_top : {0, 1, 5, 20}) {
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(n_top, V));
      const int32_t token = static_cast<int32_t>(V / 3);
      float lp = 0;
      std::vector<int32_t> ids(n);
      std::vector<float> lps(n);
      cpu::logprobs(logits.data(), V, token, n_top, &lp, ids.data(), lps.data());
      DevBuf<float> dl(logits), dlp(1), dlps(std::max(n, 1));
      DevBuf<int32_t> dids(std::max(n, 1)), dtok(std::vector<int32_t>{token});
      cuda::logprobs(dl.p, V, dtok.p, n_top, dlp.p, dids.p, dlps.p, nullptr);
      CHECK_NEAR(dlp.download()[0], lp, 1e-5);
      const auto gids = dids.download();
      const auto glps = dlps.download();
      for (int32_t j = 0; j < n; ++j) {
        CHECK_EQ(gids[j], ids[j]);
        CHECK_NEAR(glps[j], lps[j], 1e-5);
      }
    }
  }
}

TEST(cuda_token_mask_matches_cpu) {
  pe_test::Rng rng(5);
  for (int64_t V : {1, 19, 33, 989, 8192, 248320}) {
    if (small_only() && V > 8192) continue;
    const int64_t n_words = (V + 31) / 32;
    for (double density : {0.0005, 0.1, 0.9}) {
      std::vector<uint32_t> mask(static_cast<size_t>(n_words), 0u);
      for (int64_t t = 0; t < V; ++t)
        if (t == V - 1 || rng.uniform() < density) mask[t >> 5] |= 1u << (t & 31);
      std::vector<float> logits = rng.normals(V, 3.0f);
      std::vector<float> want = logits;
      cpu::apply_token_mask(want.data(), V, mask.data());
      DevBuf<float> dl(logits);
      DevBuf<uint32_t> dm(mask);
      cuda::apply_token_mask(dl.p, V, dm.p, nullptr);
      const std::vector<float> got = dl.download();
      int64_t diff = 0;
      for (int64_t t = 0; t < V; ++t) diff += !(got[t] == want[t]);
      CHECK_EQ(diff, 0);
      DevBuf<uint8_t> scratch(cuda::sample_scratch_bytes(V));
      DevBuf<int32_t> dtok(1);
      std::vector<float> w(V);
      std::vector<int32_t> idx(V);
      int mismatches = 0, outside = 0;
      for (const SamplingConfig& p : {SamplingConfig{0.0f}, SamplingConfig{1.0f}, SamplingConfig{0.8f, 40, 0.9f}}) {
        for (int j = 0; j < 10; ++j) {
          const float u = (j + 0.37f) / 10;
          cuda::sample(dl.p, V, p, u, dtok.p, scratch.p, scratch.n, nullptr);
          const int32_t tok = dtok.download()[0];
          outside += !((mask[tok >> 5] >> (tok & 31)) & 1u);
          mismatches += tok != cpu::sample(want.data(), V, p, u, w.data(), idx.data());
        }
      }
      std::printf("  token mask V=%lld density=%.4f: %d/30 sample mismatches\n", (long long)V, density, mismatches);
      CHECK_EQ(outside, 0);
      CHECK(mismatches <= 1);
    }
  }
}
