// Tensor parallel, one process per rank: rank 0 (the leader) runs the engine and sends every
// forward to the other ranks (the workers), which run the same forward on their weight shards and
// pools of the same shape; the model's forward meets them in its all-reduces.
//
// The leader sends, before each forward, one message: the GDN pool ops the engine made since the
// last forward (slots zeroed, snapshots restored: GdnPoolOp), and the batch (tokens, chunks, page
// tables, snapshot points). KV page tables need no mirror: pages are ids, and every rank's pool
// has the same pages. Pool shapes come first (setup), so the ids mean the same on every rank.
// Workers never sample: the leader samples from the gathered logits, so overlapped steps (whose
// tokens are taken from the leader's last sampling) are off at TP > 1.
//
// A worker that fails (out of memory, a bad shard) aborts the group with its reason; the leader's
// next collective throws it, and the engine fails the step's requests with that message. A leader
// that dies is seen by the workers' wait, which throws; tp_worker_run returns the error.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cache/gdn_pool.h"
#include "cache/kv_pool.h"
#include "comm/communicator.h"
#include "model/model.h"

namespace pe {

// The shape of a pair of pools every rank makes alike (and the workspace to reserve).
struct TpPoolShape {
  int64_t kv_pages = 0, kv_page_size = 16;
  int32_t kv_dtype = 0;
  int64_t kv_extra_layers = 0;  // attention layers after the model's (the MTP head's KV)
  int64_t gdn_running = 0, gdn_snapshot = 0;
  int64_t reserve_tokens = 0, reserve_seqs = 0, reserve_context = 0;  // 0: no reserve
  int64_t reserve_kept_layers = 0;  // hidden rows the steps keep for a drafter (Batch::keep_hidden)
};

class TpLeader {
 public:
  explicit TpLeader(Communicator& comm) : comm_(comm) {}
  ~TpLeader();  // tells the workers to stop (never throws)
  TpLeader(const TpLeader&) = delete;
  TpLeader& operator=(const TpLeader&) = delete;

  // The engine's pools: the workers make theirs (and reserve their workspace); from then on the
  // GDN pool's ops outside forwards are recorded for the next step.
  void setup(const TpPoolShape& shape, GdnPool& gdn);
  // The leader's forward on the engine's pools: sends the batch (and the recorded ops), then runs
  // `model`'s forward here. Throws what the group or the forward throws.
  void forward(Model& model, const Batch& b, KvPool& kv, GdnPool& gdn, ForwardResult& out);
  // A forward on scratch pools of `shape` (prompt logits): every worker makes pools of that shape
  // for this forward only.
  void forward_scratch(Model& model, const Batch& b, const TpPoolShape& shape, KvPool& kv, GdnPool& gdn,
                       ForwardResult& out);
  // The MTP head over one sequence (Model::mtp_forward): every rank runs it on the same tokens and
  // final hidden states [n, hidden], each on a scratch MTP KV pool of `shape` (kv_pages, page size).
  void mtp_forward(Model& model, const std::vector<int32_t>& tokens, const std::vector<float>& hidden,
                   const TpPoolShape& shape, KvPool& mtp_kv, std::vector<float>& logits);
  // The MTP head over a batch in the engine's pools (Model::mtp_step, speculative decoding): every
  // rank runs it from the hidden rows its own last forward or head step kept.
  void mtp_step(Model& model, const Batch& b, const std::vector<int32_t>& hidden_rows, KvPool& kv, int64_t kv_layer,
                ForwardResult& out);

 private:
  void send(const std::vector<uint8_t>& msg);
  Communicator& comm_;
  std::mutex mu_;  // one message and its forward at a time (engine thread, prompt logits)
  std::vector<GdnPoolOp> journal_;
  bool stopped_ = false;
};

// A worker rank's loop: receives the leader's messages and runs their forwards on `model` (this
// rank's shard) until the leader stops the group. Throws (after aborting the group) on failure.
// at_stop (tests): sees the worker's pools when the leader stops it.
void tp_worker_run(Model& model, Communicator& comm,
                   const std::function<void(KvPool&, GdnPool&)>& at_stop = {});

// The wire format of one message (exposed for tests).
enum class TpMessage : int32_t { Setup = 1, Step = 2, ScratchStep = 3, Stop = 4, MtpScratch = 5, MtpStep = 6 };
// hidden: the final hidden states an MtpScratch message carries; rows: an MtpStep's hidden rows
// and its KV layer last (empty for the others).
std::vector<uint8_t> tp_encode_step(TpMessage kind, const TpPoolShape& shape, const std::vector<GdnPoolOp>& ops,
                                    const Batch& b, int64_t page_size, const std::vector<float>& hidden = {},
                                    const std::vector<int32_t>& rows = {});
struct TpDecoded {
  TpMessage kind = TpMessage::Stop;
  TpPoolShape shape;
  std::vector<GdnPoolOp> ops;
  Batch batch;
  std::vector<std::vector<int32_t>> page_tables;  // batch.seqs[i].page_table points into these
  std::vector<float> hidden;
  std::vector<int32_t> rows;
};
void tp_decode(const std::vector<uint8_t>& msg, TpDecoded& out);

}  // namespace pe
