// The model's two-half sampling (model.h sample_launch / sample_collect) and fed tokens
// (Batch::token_from_sample) on the CPU model, the reference the CUDA model's feed_tokens and
// pinned-buffer sampling follow: a forward whose tokens come from the latest launch equals the
// same forward with those tokens given; launches are collected oldest first; misuse is refused.
#include <cstring>
#include <functional>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "check.h"
#include "core/error.h"
#include "model/qwen35.h"
#include "tiny_config.h"

using namespace pe;

namespace {

// One sequence per slot s (page s of 16 tokens), n tokens each from position n_past.
Batch batch_of(const std::vector<std::vector<int32_t>>& toks, int64_t n_past, const std::vector<int32_t>& pages) {
  Batch b;
  for (size_t s = 0; s < toks.size(); ++s) {
    SeqChunk c;
    c.n_past = n_past;
    c.n_new = static_cast<int64_t>(toks[s].size());
    c.gdn_slot = static_cast<int32_t>(s);
    c.page_table = &pages[s];
    b.tokens.insert(b.tokens.end(), toks[s].begin(), toks[s].end());
    b.seqs.push_back(c);
  }
  return b;
}

std::vector<SampleJob> greedy_jobs(int n) {
  std::vector<SampleJob> jobs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    jobs[i].row = i;
    jobs[i].cfg.temperature = 0.0f;
    jobs[i].n_logprobs = 2;
  }
  return jobs;
}

bool refused(const std::function<void()>& f, const char* what) {
  try {
    f();
  } catch (const Error& e) {
    return std::strstr(e.what(), what) != nullptr;
  }
  return false;
}

}  // namespace

TEST(fed_tokens_equal_given_tokens) {
  const ModelConfig c = pe_test::tiny_config();
  Qwen35Model m(c);
  m.load_dummy(DType::F32, 3);
  const std::vector<int32_t> pages = {0, 1};
  KvPool kv_a(c, 2, 16), kv_b(c, 2, 16);
  GdnPool gdn_a(c, 2, 0), gdn_b(c, 2, 0);
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 12}, {40, 2, 33}};
  ForwardResult res;
  m.forward(batch_of(prompts, 0, pages), kv_a, gdn_a, res);
  m.forward(batch_of(prompts, 0, pages), kv_b, gdn_b, res);
  m.sample_launch(res, greedy_jobs(2));  // not collected yet
  std::vector<SampleOut> first;
  // Fed: row 0 takes job 1's token, row 1 job 0's (sequences swapped on purpose: slot s holds
  // prompt s, so a swap feeds each the other's token; the given run does the same by hand).
  Batch fed = batch_of({{0}, {0}}, 3, pages);
  fed.token_from_sample = {1, 0};
  ForwardResult res_fed, res_given;
  m.forward(fed, kv_a, gdn_a, res_fed);
  m.sample_collect(first);
  CHECK_EQ(static_cast<int64_t>(first.size()), 2);
  m.forward(batch_of({{first[1].token}, {first[0].token}}, 3, pages), kv_b, gdn_b, res_given);
  CHECK(res_fed.logits == res_given.logits);
  // Mixed rows: -1 keeps the given token.
  Batch mixed = batch_of({{7}, {0}}, 4, pages);
  mixed.token_from_sample = {-1, 0};
  m.sample_launch(res_fed, greedy_jobs(2));
  std::vector<SampleOut> second;
  m.forward(mixed, kv_a, gdn_a, res_fed);
  m.sample_collect(second);
  m.forward(batch_of({{7}, {second[0].token}}, 4, pages), kv_b, gdn_b, res_given);
  CHECK(res_fed.logits == res_given.logits);
}

TEST(sample_launches_are_collected_oldest_first_and_misuse_is_refused) {
  const ModelConfig c = pe_test::tiny_config();
  Qwen35Model m(c);
  m.load_dummy(DType::F32, 4);
  const std::vector<int32_t> pages = {0, 1};
  KvPool kv(c, 2, 16);
  GdnPool gdn(c, 2, 0);
  ForwardResult r1, r2;
  m.forward(batch_of({{1, 2}, {3, 4}}, 0, pages), kv, gdn, r1);
  m.forward(batch_of({{8}, {9}}, 2, pages), kv, gdn, r2);
  std::vector<SampleOut> want1, want2, got1, got2;
  m.sample_launch(r1, greedy_jobs(2));  // one at a time: the reference
  m.sample_collect(want1);
  m.sample_launch(r2, greedy_jobs(1));
  m.sample_collect(want2);
  m.sample_launch(r1, greedy_jobs(2));
  m.sample_launch(r2, greedy_jobs(1));
  CHECK(refused([&] { m.sample_launch(r1, greedy_jobs(1)); }, "already waiting"));
  m.sample_collect(got1);
  m.sample_collect(got2);
  CHECK(got1.size() == 2 && got2.size() == 1);
  CHECK(got1[0].token == want1[0].token && got1[1].token == want1[1].token && got2[0].token == want2[0].token);
  CHECK(got1[1].logprob == want1[1].logprob && got1[1].top_ids[0] == want1[1].top_ids[0]);
  std::vector<SampleOut> none;
  CHECK(refused([&] { m.sample_collect(none); }, "nothing was launched"));
  // The latest launch had one job: job 1 is out of range; so is a count that does not match.
  Batch bad = batch_of({{0}, {0}}, 3, pages);
  bad.token_from_sample = {0, 1};
  CHECK(refused([&] { m.forward(bad, kv, gdn, r1); }, "token_from_sample"));
  bad.token_from_sample = {0};
  CHECK(refused([&] { m.forward(bad, kv, gdn, r1); }, "token_from_sample"));
}
