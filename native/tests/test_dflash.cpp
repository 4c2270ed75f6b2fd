// The DFlash draft (model/dflash.h) on the CPU over a tiny random target and draft: sequences
// batched in one step equal each drafted alone, the context appended in pieces equals it appended
// at once, greedy sampling of the draft's logits, the target's layer features (the last layer's
// normed gives the model's final hidden state), and misuse refused with a message. The numbers
// against the NumPy reference are tests/test_dflash_engine.py's.
#include <cstring>
#include <functional>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "check.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/dflash.h"
#include "model/qwen35.h"
#include "tiny_config.h"

using namespace pe;

namespace {

constexpr int64_t kBlock = 4, kPage = 4;

pe_draft_config draft_c(const std::vector<int32_t>& layers) {
  pe_draft_config c{};
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 8;
  c.vocab_size = 100;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  c.block_size = kBlock;
  c.mask_token_id = 99;
  c.n_target_layers = static_cast<int32_t>(layers.size());
  c.target_layer_ids = layers.data();
  return c;
}

struct Fixture {
  ModelConfig tc = pe_test::tiny_config();
  Qwen35Model target{tc};
  std::vector<int32_t> layers = {1, 0};
  DFlashDraft draft;
  Fixture() : draft((target.load_dummy(DType::F32, 5), DFlashConfig::from_c(draft_c(layers), tc)), target) {
    pe_test::Rng rng(17);
    for (const auto& [name, t] : draft.weights().tensors()) {
      std::vector<float> v = rng.normals(t.numel(), t.kind == TensorKind::Matrix ? 0.5f : 0.2f);
      if (t.kind == TensorKind::Vector)
        for (float& x : v) x += 1.0f;  // Qwen3 norms: w around 1
      draft.weights().set(name, DType::F32, t.shape, v.data());
    }
    draft.finalize();
  }
  int64_t feature_width() const { return static_cast<int64_t>(layers.size()) * tc.hidden; }
};

bool refused(const std::function<void()>& f, const char* what) {
  try {
    f();
  } catch (const Error& e) {
    if (std::strstr(e.what(), what)) return true;
    std::printf("  message: %s\n", e.what());
  }
  return false;
}

// Sequence i: pages 4i .. 4i + 3 (16 rows: context up to 12 + a block of 4).
std::vector<int32_t> page_tables(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < 4 * n; ++i) t.push_back(i);
  return t;
}

}  // namespace

TEST(batched_sequences_equal_each_alone) {
  Fixture f;
  const int64_t FW = f.feature_width();
  pe_test::Rng rng(3);
  const std::vector<float> feats = rng.normals(3 * 12 * FW, 2.0f);
  const std::vector<int32_t> tables = page_tables(3);
  const int64_t first[3] = {3, 0, 7}, second[3] = {2, 5, 0};
  const int32_t tokens[3] = {11, 42, 99};
  auto seq = [&](int i, int64_t n_context, int64_t n_new) {
    DraftSeq s;
    s.n_context = n_context;
    s.n_new = n_new;
    s.features = feats.data() + (i * 12 + n_context) * FW;
    s.layer_stride = 8;
    s.row_stride = FW;
    s.last_token = tokens[i];
    s.page_table = tables.data() + 4 * i;
    return s;
  };
  KvPool alone(f.draft.config().cache_shape(), 12, kPage), batched(f.draft.config().cache_shape(), 12, kPage);
  std::vector<std::vector<float>> ref(3);
  for (int i = 0; i < 3; ++i) {
    ForwardResult r;
    f.draft.forward({seq(i, 0, first[i])}, alone, true, r);
    f.draft.forward({seq(i, first[i], second[i])}, alone, true, r);
    ref[i] = r.logits;
  }
  ForwardResult r;
  f.draft.forward({seq(0, 0, first[0]), seq(1, 0, first[1]), seq(2, 0, first[2])}, batched, true, r);
  f.draft.forward({seq(0, first[0], second[0]), seq(1, first[1], second[1]), seq(2, first[2], second[2])}, batched,
                  true, r);
  const int64_t rows = (kBlock - 1) * 100;
  CHECK_EQ(static_cast<int64_t>(r.logits.size()), 3 * rows);
  CHECK_EQ(static_cast<int64_t>(r.hidden.size()), 3 * (kBlock - 1) * 8);
  for (int i = 0; i < 3; ++i) {
    CHECK_EQ(r.logit_row_begin[i], i * (kBlock - 1));
    CHECK_CLOSE(r.logits.data() + i * rows, ref[i].data(), rows, 1e-6);
  }
  // The second step of sequence 0 in pieces of 1 + 1 rows equals its 2 rows at once.
  KvPool pieces(f.draft.config().cache_shape(), 12, kPage);
  f.draft.forward({seq(0, 0, first[0])}, pieces, true, r);
  f.draft.forward({seq(0, first[0], 1)}, pieces, true, r);
  f.draft.forward({seq(0, first[0] + 1, 1)}, pieces, true, r);
  CHECK_CLOSE(r.logits.data(), ref[0].data(), rows, 1e-6);
  // A different context gives different logits (the block reads the cache).
  f.draft.forward({seq(1, 0, 4)}, pieces, true, r);  // ref[1] had 5 rows
  const pe_test::Error e = pe_test::compare(r.logits.data(), ref[1].data(), rows);
  CHECK(e.max_abs > 1e-3);
  // Layer-major features (the rows a target forward keeps, Batch::keep_hidden) give the same
  // logits; a sequence without a block only appends its context rows and drafts later from it.
  const int64_t H = 8, NF = 2, R = 3 * 12;
  std::vector<float> lm(feats.size());
  for (int64_t t = 0; t < R; ++t)
    for (int64_t j = 0; j < NF; ++j) std::memcpy(&lm[(j * R + t) * H], &feats[t * FW + j * H], sizeof(float) * H);
  auto seq_lm = [&](int i, int64_t n_context, int64_t n_new) {
    DraftSeq s = seq(i, n_context, n_new);
    s.features = lm.data() + (i * 12 + n_context) * H;
    s.layer_stride = R * H;
    s.row_stride = H;
    return s;
  };
  KvPool mixed(f.draft.config().cache_shape(), 12, kPage);
  f.draft.forward({seq_lm(0, 0, first[0]), seq_lm(1, 0, first[1]), seq_lm(2, 0, first[2])}, mixed, true, r);
  DraftSeq quiet = seq_lm(1, first[1], second[1]);
  quiet.draft = false;
  f.draft.forward({seq_lm(0, first[0], second[0]), quiet, seq_lm(2, first[2], second[2])}, mixed, true, r);
  CHECK_EQ(static_cast<int64_t>(r.logits.size()), 2 * rows);
  CHECK_EQ(r.logit_row_begin[1], -1);
  CHECK_EQ(r.logit_row_begin[2], kBlock - 1);
  CHECK_CLOSE(r.logits.data(), ref[0].data(), rows, 1e-6);
  CHECK_CLOSE(r.logits.data() + rows, ref[2].data(), rows, 1e-6);
  f.draft.forward({seq_lm(1, first[1] + second[1], 0)}, mixed, true, r);
  CHECK_CLOSE(r.logits.data(), ref[1].data(), rows, 1e-6);
  // Fewer logit rows: the block's leading ones, the same numbers.
  DraftSeq two = seq_lm(1, first[1] + second[1], 0);
  two.n_logits = 2;
  f.draft.forward({two, seq_lm(1, first[1] + second[1], 0)}, mixed, true, r);
  CHECK_EQ(static_cast<int64_t>(r.logits.size()), 2 * 100 + rows);
  CHECK_EQ(r.logit_row_begin[1], 2);
  CHECK_CLOSE(r.logits.data(), ref[1].data(), 2 * 100, 1e-6);
  two.n_logits = kBlock;
  CHECK(refused([&] { f.draft.forward({two}, mixed, true, r); }, "4 logit rows of a block of 4"));
  quiet.n_new = 0;
  quiet.n_context = first[1] + second[1];
  f.draft.forward({quiet}, mixed, true, r);
  CHECK(r.logits.empty());
}

TEST(greedy_sampling_takes_the_argmax_of_each_row) {
  Fixture f;
  pe_test::Rng rng(4);
  const std::vector<float> feats = rng.normals(6 * f.feature_width());
  const std::vector<int32_t> tables = page_tables(1);
  KvPool kv(f.draft.config().cache_shape(), 4, kPage);
  DraftSeq s;
  s.n_new = 6;
  s.features = feats.data();
  s.layer_stride = 8;
  s.row_stride = f.feature_width();
  s.last_token = 5;
  s.page_table = tables.data();
  ForwardResult r;
  f.draft.forward({s}, kv, true, r);
  std::vector<SampleJob> jobs(kBlock - 1);
  for (int64_t j = 0; j < kBlock - 1; ++j) {
    jobs[j].row = j;
    jobs[j].cfg.temperature = 0.0f;
  }
  f.draft.sample_launch(r, jobs);
  std::vector<SampleOut> outs;
  f.draft.sample_collect(outs);
  for (int64_t j = 0; j < kBlock - 1; ++j) {
    const float* row = r.logits.data() + j * 100;
    CHECK_EQ(outs[j].token, static_cast<int32_t>(std::max_element(row, row + 100) - row));
  }
}

TEST(kept_hidden_rows_are_the_layer_outputs) {
  Fixture f;
  const ModelConfig& c = f.tc;
  const int64_t H = c.hidden;
  KvPool kv(c, 2, 16);
  GdnPool gdn(c, 3, 0);
  const std::vector<int32_t> pages = {0, 1};
  Batch b;
  b.tokens = {3, 14, 15, 92, 65};
  SeqChunk s;
  s.n_new = 5;
  s.gdn_slot = gdn.alloc_running();
  s.page_table = pages.data();
  s.logits = LogitsMode::None;
  b.seqs.push_back(s);
  b.keep_hidden = {1, 0, -1};
  ForwardResult r;
  f.target.forward(b, kv, gdn, r);  // the engine's way: kept by the model
  CHECK(r.kept.empty());
  int64_t rows = 0;
  const float* l1 = f.target.kept_hidden(1, &rows);
  CHECK_EQ(rows, 5);
  CHECK(l1 != nullptr && f.target.kept_hidden(0, nullptr) == l1 + 5 * H && f.target.kept_hidden(-1, nullptr) == l1 + 10 * H);
  // Layer 1 is the last: its output normed with the final norm is the model's hidden state.
  std::vector<float> normed(5 * H);
  cpu::rms_norm(l1, f.target.weights().vec("norm.weight"), 5, H, c.eps, true, normed.data());
  CHECK_CLOSE(normed.data(), r.hidden.data(), normed.size(), 1e-6);
  CHECK_CLOSE(f.target.kept_hidden(-1, nullptr), r.hidden.data(), normed.size(), 0.0);
  const std::vector<float> kept(l1, l1 + 15 * H);
  // For the host: the same rows in ForwardResult::kept, the model's kept rows untouched.
  b.keep_hidden = {0, 1};
  b.keep_for_host = true;
  b.seqs[0].gdn_slot = gdn.alloc_running();
  f.target.forward(b, kv, gdn, r);
  CHECK_EQ(static_cast<int64_t>(r.kept.size()), 10 * H);
  CHECK_CLOSE(r.kept.data(), kept.data() + 5 * H, 5 * H, 0.0);
  CHECK_CLOSE(r.kept.data() + 5 * H, kept.data(), 5 * H, 0.0);
  CHECK(f.target.kept_hidden(1, nullptr) == l1 && f.target.kept_hidden(-1, nullptr) != nullptr);
  CHECK_CLOSE(l1, kept.data(), kept.size(), 0.0);
  b.keep_hidden = {2};
  b.seqs[0].gdn_slot = gdn.alloc_running();
  CHECK(refused([&] { f.target.forward(b, kv, gdn, r); }, "kept hidden layer 2 outside -1 .. 1"));
}

TEST(misuse_is_refused_with_a_message) {
  Fixture f;
  const ModelConfig& tc = f.tc;
  std::vector<int32_t> bad = {2};
  CHECK(refused([&] { DFlashConfig::from_c(draft_c(bad), tc); }, "target_layer_ids[0] = 2 outside"));
  pe_draft_config c = draft_c(f.layers);
  c.hidden_size = 16;
  CHECK(refused([&] { DFlashConfig::from_c(c, tc); }, "hidden_size 16 differs"));
  DFlashDraft empty(DFlashConfig::from_c(draft_c(f.layers), tc), f.target);
  KvPool kv(f.draft.config().cache_shape(), 4, kPage);
  const std::vector<int32_t> table = page_tables(1);
  DraftSeq s;
  s.last_token = 5;
  s.page_table = table.data();
  ForwardResult r;
  CHECK(refused([&] { empty.forward({s}, kv, true, r); }, "not finalized"));
  CHECK(refused([&] { empty.finalize(); }, "tensor fc.weight is missing"));
  CHECK(refused([&] { empty.weights().set("fc.weight", DType::F32, {8, 8}, table.data()); }, "expected [8, 16]"));
  s.last_token = 100;
  CHECK(refused([&] { f.draft.forward({s}, kv, true, r); }, "token id 100 outside"));
  s.last_token = 5;
  s.n_context = 20;  // the block would need pages past the table's 4
  const std::vector<int32_t> far = {0, 1, 2, 3, 4, 5, 6};
  s.page_table = far.data();
  CHECK(refused([&] { f.draft.forward({s}, kv, true, r); }, "page 4 outside the pool of 4"));
  ModelConfig one = f.tc;
  one.is_full_attention = {true};
  one.n_layers = 1;
  KvPool wrong(one, 4, kPage);
  s.n_context = 0;
  s.page_table = table.data();
  CHECK(refused([&] { f.draft.forward({s}, wrong, true, r); }, "draft KV pool of 1 layers"));
}
