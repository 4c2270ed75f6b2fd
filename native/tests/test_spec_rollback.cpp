// Speculative decoding's rollback on the CPU model and the scheduler: a verify chunk of 1 + k
// tokens that copies the GDN state after each of its first k tokens into position slots (the
// forward's in-chunk state copies) leaves in each slot exactly the state that decoding the tokens
// one at a time reaches there, its logit rows equal the decode steps' logits, and decoding on from
// a position slot (the state after the last accepted token) equals decoding on from the state of a
// sequence that never saw the rejected drafts. Scheduler::accept swaps that slot in, frees the
// others and the snapshots taken after a rejected token; trim_pages drops wholly rejected pages.
#include <cmath>
#include <memory>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "cache/prefix_cache.h"
#include "check.h"
#include "engine/scheduler.h"
#include "model/qwen35.h"
#include "tiny_config.h"

using namespace pe;

namespace {

Batch one_chunk(const std::vector<int32_t>& toks, int64_t n_past, int32_t slot, const int32_t* pages,
                LogitsMode logits) {
  Batch b;
  SeqChunk c;
  c.n_past = n_past;
  c.n_new = static_cast<int64_t>(toks.size());
  c.gdn_slot = slot;
  c.page_table = pages;
  c.logits = logits;
  b.tokens = toks;
  b.seqs.push_back(c);
  return b;
}

float max_diff(const float* a, const float* b, int64_t n) {
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

float slot_diff(GdnPool& g, int32_t a, int32_t b) {
  return max_diff(g.conv_state(a, 0), g.conv_state(b, 0), g.slot_floats());
}

}  // namespace

TEST(verify_chunk_position_slots_hold_the_decoded_states_and_decoding_resumes_from_them) {
  ModelConfig c = pe_test::tiny_config();
  c.is_full_attention = {false, true, false};  // GDN, attention, GDN: both mixers, two GDN layers
  c.n_layers = 3;
  Qwen35Model m(c);
  m.load_dummy(DType::F32, 11);
  const int64_t V = c.vocab, k = 3;
  KvPool kv(c, 4, 16);
  GdnPool gdn(c, 2 + 2 * k + 1, 0);
  const int32_t live = 0, ref = 1;
  const int32_t pos_slot[k] = {2, 3, 4}, ref_after[k + 1] = {5, 6, 7, 8};
  const int32_t page_live = 0, page_ref = 1;
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  const std::vector<int32_t> verify = {35, 89, 79, 32};  // the next token and 3 drafts
  const int64_t P = static_cast<int64_t>(prompt.size());
  ForwardResult res;
  m.forward(one_chunk(prompt, 0, live, &page_live, LogitsMode::None), kv, gdn, res);
  m.forward(one_chunk(prompt, 0, ref, &page_ref, LogitsMode::None), kv, gdn, res);

  Batch vb = one_chunk(verify, P, live, &page_live, LogitsMode::All);
  for (int64_t i = 0; i < k; ++i) vb.seqs[0].snapshots.emplace_back(i + 1, pos_slot[i]);
  ForwardResult vres;
  m.forward(vb, kv, gdn, vres);
  CHECK_EQ(static_cast<int64_t>(vres.logits.size()), (k + 1) * V);

  for (int64_t i = 0; i <= k; ++i) {
    ForwardResult d;
    m.forward(one_chunk({verify[i]}, P + i, ref, &page_ref, LogitsMode::Last), kv, gdn, d);
    CHECK(max_diff(d.logits.data(), vres.logits.data() + i * V, V) < 1e-4f);
    gdn.copy(ref_after[i], ref);  // the state after token i
    const int32_t got = i < k ? pos_slot[i] : live;
    CHECK(slot_diff(gdn, got, ref_after[i]) < 1e-5f);
  }

  // One draft accepted, then token 7 instead of draft 2: decoding on from position slot 1 (the
  // state after 2 tokens), over the rejected drafts' KV rows, equals a clean sequence that only
  // ever saw the accepted tokens; from the live slot (all 4 tokens in its state) it does not.
  GdnPool clean(c, 1, 0);
  KvPool kv_clean(c, 1, 16);
  std::vector<int32_t> accepted = prompt;
  accepted.insert(accepted.end(), {verify[0], verify[1], 7});
  const int32_t page0 = 0;
  ForwardResult want, got, stale;
  m.forward(one_chunk(accepted, 0, 0, &page0, LogitsMode::Last), kv_clean, clean, want);
  gdn.copy(ref, live);
  m.forward(one_chunk({7}, P + 2, pos_slot[1], &page_live, LogitsMode::Last), kv, gdn, got);
  CHECK(max_diff(want.logits.data(), got.logits.data(), V) < 1e-4f);
  m.forward(one_chunk({7}, P + 2, ref, &page_live, LogitsMode::Last), kv, gdn, stale);
  CHECK(max_diff(want.logits.data(), stale.logits.data(), V) > 1e-3f);
}

TEST(scheduler_accept_swaps_the_slot_releases_the_rest_and_trims_pages) {
  ModelConfig cfg = pe_test::tiny_config();
  const int64_t k = 3, page = 4;
  KvPool kv(cfg, 16, page);
  GdnPool gdn(cfg, 1 + k, 8);
  PrefixCache cache(kv, gdn, 1);
  SchedulerParams p;
  p.max_batch = 1;
  p.chunked_prefill_size = 64;
  p.max_num_batched_tokens = 64;
  Scheduler sched(p, kv, gdn, &cache);
  auto owned = std::make_unique<Request>();
  Request* r = owned.get();
  r->id = 1;
  for (int i = 0; i < 6; ++i) r->tokens.push_back(10 + i);
  r->n_prompt = 6;
  r->max_tokens = 32;
  sched.add(std::move(owned));
  auto chunks = sched.schedule();  // the prompt
  CHECK_EQ(static_cast<int64_t>(chunks.size()), 1);
  sched.commit(chunks);
  r->tokens.push_back(50);  // its first token, pending
  r->drafts = {51, 52, 53};
  const int32_t live_before = r->gdn_slot;
  const int64_t snapshots_free = gdn.n_snapshot_free();
  chunks = sched.schedule();  // verify: positions 6 .. 9; block boundary at 8 (offset 2) snapshots
  CHECK_EQ(static_cast<int64_t>(chunks.size()), 1);
  ScheduledChunk& c = chunks[0];
  CHECK_EQ(c.n_drafts, k);
  CHECK_EQ(c.n_tokens, 1 + k);
  CHECK_EQ(static_cast<int64_t>(c.position_slots.size()), k);
  CHECK_EQ(gdn.n_running_free(), int64_t(0));
  CHECK_EQ(static_cast<int64_t>(r->pages.size()), int64_t(3));  // 10 tokens
  // Keep the next token only (every draft rejected): state after 1 token = position slot 0.
  const int32_t want_slot = c.position_slots[0];
  bool had_late_snapshot = false;
  for (const SnapshotPoint& s : c.snapshots) had_late_snapshot = had_late_snapshot || s.offset > 1;
  CHECK(had_late_snapshot);
  sched.accept(c, 1);
  CHECK_EQ(r->gdn_slot, want_slot);
  CHECK(r->gdn_slot != live_before);
  CHECK_EQ(c.n_tokens, int64_t(1));
  CHECK(c.position_slots.empty());
  CHECK_EQ(gdn.n_running_free(), k);  // the old live slot and the other position slots
  for (const SnapshotPoint& s : c.snapshots) CHECK(s.offset <= 1);
  CHECK_EQ(gdn.n_snapshot_free(), snapshots_free);  // the late snapshot went back
  sched.commit(chunks);
  CHECK_EQ(r->n_computed, int64_t(7));
  sched.trim_pages(*r);  // positions 0 .. 7 (the next token's too): two pages
  CHECK_EQ(static_cast<int64_t>(r->pages.size()), int64_t(2));
}
