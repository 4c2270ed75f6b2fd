// The tensor-parallel leader / worker plumbing on the CPU communicator: the step message round
// trip, and a worker that mirrors the leader's pools exactly (every rank holds the whole tiny model
// here, so both forwards compute the same states: any op the worker missed or repeated shows as a
// different pool checksum). A leader that dies makes the worker fail instead of waiting forever.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "check.h"
#include "fork_ranks.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "engine/tp_group.h"
#include "model/qwen35.h"
#include "tiny_config.h"

using namespace pe;

namespace {

double checksum(const float* p, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += p[i] * static_cast<double>(1 + i % 7);
  return s;
}

double pools_checksum(KvPool& kv, GdnPool& gdn, const ModelConfig& c) {
  double s = checksum(gdn.conv_state(0, 0), gdn.slot_floats() * (gdn.n_running() + gdn.n_snapshot()));
  const cpu::PagedKV layer = kv.layer(0);
  const int64_t n = kv.n_pages() * kv.page_size() * c.n_kv_heads * c.head_dim;
  return s + checksum(static_cast<const float*>(layer.k), n) + checksum(static_cast<const float*>(layer.v), n);
}

SeqChunk chunk(int64_t n_past, int64_t n_new, int32_t slot, const int32_t* pages) {
  SeqChunk s;
  s.n_past = n_past;
  s.n_new = n_new;
  s.gdn_slot = slot;
  s.page_table = pages;
  return s;
}

}  // namespace

TEST(step_message_round_trip) {
  Batch b;
  b.tokens = {5, 6, 7, 8};
  b.host_outputs = false;
  const int32_t pages_a[] = {3, 9}, pages_b[] = {4};
  SeqChunk a = chunk(14, 3, 2, pages_a);
  a.snapshots = {{1, 7}, {3, 8}};
  a.logits = LogitsMode::All;
  b.seqs = {a, chunk(0, 1, 0, pages_b)};
  TpPoolShape shape;
  shape.kv_pages = 12;
  shape.gdn_snapshot = 5;
  const std::vector<GdnPoolOp> ops = {{GdnPoolOp::Zero, 1, -1}, {GdnPoolOp::Copy, 2, 6}};
  TpDecoded d;
  tp_decode(tp_encode_step(TpMessage::Step, shape, ops, b, 16), d);
  CHECK(d.kind == TpMessage::Step);
  CHECK_EQ(d.shape.kv_pages, 12);
  CHECK_EQ(d.shape.gdn_snapshot, 5);
  CHECK_EQ(d.ops.size(), size_t(2));
  CHECK_EQ(d.ops[1].src, 6);
  CHECK(d.batch.tokens == b.tokens);
  CHECK(!d.batch.host_outputs);
  CHECK_EQ(d.batch.seqs.size(), size_t(2));
  CHECK_EQ(d.batch.seqs[0].n_past, 14);
  CHECK_EQ(d.batch.seqs[0].page_table[1], 9);  // ceil(17 / 16) = 2 pages
  CHECK(d.batch.seqs[0].logits == LogitsMode::All);
  CHECK(d.batch.seqs[0].snapshots == a.snapshots);
  CHECK_EQ(d.batch.seqs[1].page_table[0], 4);
  // A fed step cannot be mirrored (the workers have no sampled tokens).
  b.token_from_sample = {0, -1, -1, -1};
  bool refused = false;
  try {
    tp_encode_step(TpMessage::Step, shape, ops, b, 16);
  } catch (const Error&) {
    refused = true;
  }
  CHECK(refused);
}

TEST(the_worker_mirrors_the_leaders_pools) {
  const std::string name = "tpgroup-" + std::to_string(getpid());
  const ModelConfig c = pe_test::tiny_config();
  auto codes = pe_test::run_ranks(2, [&](int rank) {
    auto comm = make_cpu_communicator(name, rank, 2);
    Qwen35Model m(c);
    m.load_dummy(DType::F32, 5);  // every rank the whole model: the same states
    double mine = 0.0;
    if (rank == 1) {
      tp_worker_run(m, *comm, [&](KvPool& kv, GdnPool& gdn) { mine = pools_checksum(kv, gdn, c); });
    } else {
      TpPoolShape shape;
      shape.kv_pages = 6;
      shape.kv_page_size = 16;
      shape.gdn_running = 3;
      shape.gdn_snapshot = 2;
      KvPool kv(c, shape.kv_pages, shape.kv_page_size);
      GdnPool gdn(c, shape.gdn_running, shape.gdn_snapshot);
      {
        TpLeader leader(*comm);
        leader.setup(shape, gdn);
        ForwardResult res;
        const int32_t s0 = gdn.alloc_running(), s1 = gdn.alloc_running(), snap = gdn.alloc_snapshot();
        const int32_t pages0[] = {0, 1}, pages1[] = {2, 3};
        // A prompt of 20 with a snapshot after 16 tokens, and another prompt of 5, in one step.
        Batch b;
        for (int i = 0; i < 25; ++i) b.tokens.push_back(1 + i % 50);
        SeqChunk a = chunk(0, 20, s0, pages0);
        a.snapshots = {{16, snap}};
        b.seqs = {a, chunk(0, 5, s1, pages1)};
        leader.forward(m, b, kv, gdn, res);
        // Outside a forward: a third sequence starts from the snapshot (the prefix cache's restore).
        const int32_t s2 = gdn.alloc_running();
        gdn.copy(s2, snap);
        const int32_t pages2[] = {0, 4};
        Batch d;
        d.tokens = {7, 8, 9, 10};
        d.seqs = {chunk(20, 1, s0, pages0), chunk(5, 1, s1, pages1), chunk(16, 2, s2, pages2)};
        leader.forward(m, d, kv, gdn, res);
        gdn.release(s1);
        const int32_t s3 = gdn.alloc_running();  // zeroed again: the worker must zero it too
        Batch e;
        e.tokens = {11};
        e.seqs = {chunk(0, 1, s3, pages1)};
        leader.forward(m, e, kv, gdn, res);
      }  // the leader stops the worker
      mine = pools_checksum(kv, gdn, c);
    }
    double both[2] = {0.0, 0.0};
    std::vector<float> v = {static_cast<float>(mine)};
    std::vector<float> all(2);
    comm->all_gather(v.data(), 1, all.data());
    both[0] = all[0];
    both[1] = all[1];
    if (both[0] == 0.0 || both[0] != both[1]) {
      std::printf("  rank %d: checksums %g vs %g\n", rank, both[0], both[1]);
      return 1;
    }
    return 0;
  });
  CHECK_EQ(codes[0], 0);
  CHECK_EQ(codes[1], 0);
}

TEST(a_dead_leader_ends_the_worker_with_an_error) {
  const std::string name = "tpdead-" + std::to_string(getpid());
  const ModelConfig c = pe_test::tiny_config();
  auto codes = pe_test::run_ranks(2, [&](int rank) {
    auto comm = make_cpu_communicator(name, rank, 2);
    Qwen35Model m(c);
    m.load_dummy(DType::F32, 5);
    if (rank == 0) _exit(0);  // dies before sending anything
    try {
      tp_worker_run(m, *comm);
    } catch (const Error& e) {
      return std::strstr(e.what(), "rank 0") ? 0 : 3;
    }
    return 1;
  });
  CHECK_EQ(codes[1], 0);
}
