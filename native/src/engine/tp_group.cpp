#include "engine/tp_group.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace pe {
namespace {

struct Writer {
  std::vector<uint8_t> bytes;
  template <class T>
  void put(const T& v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  template <class T>
  void put_all(const T* p, int64_t n) {
    put(n);
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T) * n);
    if (n) std::memcpy(bytes.data() + at, p, sizeof(T) * n);
  }
};

struct Reader {
  const std::vector<uint8_t>& bytes;
  size_t at = 0;
  template <class T>
  T get() {
    if (at + sizeof(T) > bytes.size()) fail(PE_ERR_INTERNAL, "tensor-parallel message truncated at byte ", at);
    T v;
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_all() {
    const int64_t n = get<int64_t>();
    if (n < 0 || at + sizeof(T) * n > bytes.size()) fail(PE_ERR_INTERNAL, "tensor-parallel message: bad count ", n);
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), bytes.data() + at, sizeof(T) * n);
    at += sizeof(T) * n;
    return v;
  }
};

void put_shape(Writer& w, const TpPoolShape& s) { w.put(s); }

// The length of a message goes first, as a fixed-size broadcast, then the message.
std::vector<uint8_t> receive(Communicator& comm) {
  int64_t n = 0;
  comm.broadcast(&n, sizeof(n), 0);
  if (n <= 0 || n > (int64_t(1) << 34)) fail(PE_ERR_INTERNAL, "tensor-parallel message of ", n, " bytes");
  std::vector<uint8_t> msg(static_cast<size_t>(n));
  comm.broadcast(msg.data(), msg.size(), 0);
  return msg;
}

std::unique_ptr<KvPool> make_kv(const Model& m, const TpPoolShape& s) {
  CacheShape shape = m.config();
  shape.n_attn_layers += s.kv_extra_layers;
  return std::make_unique<KvPool>(shape, s.kv_pages, s.kv_page_size, static_cast<DType>(s.kv_dtype), m.device());
}
std::unique_ptr<GdnPool> make_gdn(const Model& m, const TpPoolShape& s) {
  return std::make_unique<GdnPool>(m.config(), s.gdn_running, s.gdn_snapshot, m.device());
}

}  // namespace

std::vector<uint8_t> tp_encode_step(TpMessage kind, const TpPoolShape& shape, const std::vector<GdnPoolOp>& ops,
                                    const Batch& b, int64_t page_size, const std::vector<float>& hidden,
                                    const std::vector<int32_t>& rows) {
  Writer w;
  w.put(kind);
  put_shape(w, shape);
  w.put_all(ops.data(), static_cast<int64_t>(ops.size()));
  if (!b.token_from_sample.empty())
    fail(PE_ERR_INTERNAL, "tensor parallel: a step fed from the last sampling (overlapped steps are off at TP > 1)");
  w.put_all(b.tokens.data(), static_cast<int64_t>(b.tokens.size()));
  w.put(static_cast<int32_t>(b.host_outputs));
  w.put(static_cast<int32_t>(b.cuda_graph));
  w.put_all(b.keep_hidden.data(), static_cast<int64_t>(b.keep_hidden.size()));
  w.put(static_cast<int64_t>(b.seqs.size()));
  for (const SeqChunk& s : b.seqs) {
    w.put(s.n_past);
    w.put(s.n_new);
    w.put(s.gdn_slot);
    w.put(s.logits);
    const int64_t n_pages = page_size > 0 ? (s.n_past + s.n_new + page_size - 1) / page_size : 0;
    w.put_all(s.page_table, s.page_table ? n_pages : 0);
    w.put(static_cast<int64_t>(s.snapshots.size()));
    for (const auto& [offset, slot] : s.snapshots) {
      w.put(offset);
      w.put(slot);
    }
  }
  w.put_all(hidden.data(), static_cast<int64_t>(hidden.size()));
  w.put_all(rows.data(), static_cast<int64_t>(rows.size()));
  return std::move(w.bytes);
}

void tp_decode(const std::vector<uint8_t>& msg, TpDecoded& out) {
  Reader r{msg};
  out.kind = r.get<TpMessage>();
  out.shape = r.get<TpPoolShape>();
  out.ops = r.get_all<GdnPoolOp>();
  out.batch = Batch{};
  out.batch.tokens = r.get_all<int32_t>();
  out.batch.host_outputs = r.get<int32_t>() != 0;
  out.batch.cuda_graph = r.get<int32_t>() != 0;
  out.batch.keep_hidden = r.get_all<int32_t>();
  const int64_t n_seqs = r.get<int64_t>();
  if (n_seqs < 0 || n_seqs > int64_t(1) << 24) fail(PE_ERR_INTERNAL, "tensor-parallel message: ", n_seqs, " chunks");
  out.page_tables.assign(static_cast<size_t>(n_seqs), {});
  out.batch.seqs.resize(static_cast<size_t>(n_seqs));
  for (int64_t i = 0; i < n_seqs; ++i) {
    SeqChunk& s = out.batch.seqs[i];
    s.n_past = r.get<int64_t>();
    s.n_new = r.get<int64_t>();
    s.gdn_slot = r.get<int32_t>();
    s.logits = r.get<LogitsMode>();
    out.page_tables[i] = r.get_all<int32_t>();
    s.page_table = out.page_tables[i].empty() ? nullptr : out.page_tables[i].data();
    const int64_t n_snap = r.get<int64_t>();
    if (n_snap < 0 || n_snap > s.n_new + 1) fail(PE_ERR_INTERNAL, "tensor-parallel message: ", n_snap, " snapshots");
    for (int64_t j = 0; j < n_snap; ++j) {
      const int64_t offset = r.get<int64_t>();
      s.snapshots.emplace_back(offset, r.get<int32_t>());
    }
  }
  out.hidden = r.get_all<float>();
  out.rows = r.get_all<int32_t>();
  if (r.at != msg.size()) fail(PE_ERR_INTERNAL, "tensor-parallel message: ", msg.size() - r.at, " bytes left over");
}

TpLeader::~TpLeader() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  try {
    send(tp_encode_step(TpMessage::Stop, {}, {}, Batch{}, 0));
  } catch (...) {
    // A group that already failed has no workers left to stop.
  }
}

void TpLeader::send(const std::vector<uint8_t>& msg) {
  int64_t n = static_cast<int64_t>(msg.size());
  comm_.broadcast(&n, sizeof(n), 0);
  comm_.broadcast(const_cast<uint8_t*>(msg.data()), msg.size(), 0);
}

void TpLeader::setup(const TpPoolShape& shape, GdnPool& gdn) {
  std::lock_guard<std::mutex> lock(mu_);
  send(tp_encode_step(TpMessage::Setup, shape, {}, Batch{}, 0));
  journal_.clear();
  gdn.set_journal(&journal_);
  comm_.barrier();  // every worker made its pools (or the group failed: this throws)
}

void TpLeader::forward(Model& model, const Batch& b, KvPool& kv, GdnPool& gdn, ForwardResult& out) {
  std::lock_guard<std::mutex> lock(mu_);
  send(tp_encode_step(TpMessage::Step, {}, journal_, b, kv.page_size()));
  journal_.clear();
  // Copies inside the forward (snapshots) are the forward's own: every rank's forward makes them.
  gdn.set_journal(nullptr);
  try {
    model.forward(b, kv, gdn, out);
  } catch (...) {
    gdn.set_journal(&journal_);
    throw;
  }
  gdn.set_journal(&journal_);
}

void TpLeader::forward_scratch(Model& model, const Batch& b, const TpPoolShape& shape, KvPool& kv, GdnPool& gdn,
                               ForwardResult& out) {
  std::lock_guard<std::mutex> lock(mu_);
  send(tp_encode_step(TpMessage::ScratchStep, shape, {}, b, kv.page_size()));
  model.forward(b, kv, gdn, out);
}

void TpLeader::mtp_forward(Model& model, const std::vector<int32_t>& tokens, const std::vector<float>& hidden,
                           const TpPoolShape& shape, KvPool& mtp_kv, std::vector<float>& logits) {
  std::lock_guard<std::mutex> lock(mu_);
  Batch b;
  b.tokens = tokens;
  send(tp_encode_step(TpMessage::MtpScratch, shape, {}, b, 0, hidden));
  model.mtp_forward(tokens.data(), static_cast<int64_t>(tokens.size()), hidden.data(), mtp_kv, logits);
}

void TpLeader::mtp_step(Model& model, const Batch& b, const std::vector<int32_t>& hidden_rows, KvPool& kv,
                        int64_t kv_layer, ForwardResult& out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> rows = hidden_rows;
  rows.push_back(static_cast<int32_t>(kv_layer));
  send(tp_encode_step(TpMessage::MtpStep, {}, {}, b, kv.page_size(), {}, rows));
  model.mtp_step(b, hidden_rows, kv, kv_layer, out);
}

void tp_worker_run(Model& model, Communicator& comm, const std::function<void(KvPool&, GdnPool&)>& at_stop) {
  std::unique_ptr<KvPool> kv;
  std::unique_ptr<GdnPool> gdn;
  TpDecoded m;
  ForwardResult result;
  try {
    for (;;) {
      tp_decode(receive(comm), m);
      switch (m.kind) {
        case TpMessage::Stop:
          if (at_stop && kv) at_stop(*kv, *gdn);
          return;
        case TpMessage::Setup:
          if (m.shape.reserve_tokens > 0)
            model.reserve(m.shape.reserve_tokens, m.shape.reserve_seqs, m.shape.reserve_context);
          if (m.shape.reserve_kept_layers > 0) model.reserve_kept(m.shape.reserve_kept_layers, m.shape.reserve_tokens);
          kv = make_kv(model, m.shape);
          gdn = make_gdn(model, m.shape);
          comm.barrier();
          break;
        case TpMessage::Step:
          if (!kv) fail(PE_ERR_INTERNAL, "tensor-parallel step before setup");
          for (const GdnPoolOp& op : m.ops) gdn->apply(op);
          model.forward(m.batch, *kv, *gdn, result);
          break;
        case TpMessage::ScratchStep: {
          auto skv = make_kv(model, m.shape);
          auto sgdn = make_gdn(model, m.shape);
          model.forward(m.batch, *skv, *sgdn, result);
          break;
        }
        case TpMessage::MtpScratch: {
          const int64_t n = static_cast<int64_t>(m.batch.tokens.size());
          if (static_cast<int64_t>(m.hidden.size()) != n * model.config().hidden)
            fail(PE_ERR_INTERNAL, "tensor-parallel MTP message: ", m.hidden.size(), " hidden floats for ", n, " tokens");
          KvPool mtp_kv(model.config().mtp_kv_config(), m.shape.kv_pages, m.shape.kv_page_size,
                        static_cast<DType>(m.shape.kv_dtype), model.device());
          std::vector<float> logits;
          model.mtp_forward(m.batch.tokens.data(), n, m.hidden.data(), mtp_kv, logits);
          break;
        }
        case TpMessage::MtpStep: {
          if (!kv) fail(PE_ERR_INTERNAL, "tensor-parallel MTP step before setup");
          if (m.rows.empty()) fail(PE_ERR_INTERNAL, "tensor-parallel MTP step without its KV layer");
          const int64_t kv_layer = m.rows.back();
          m.rows.pop_back();
          model.mtp_step(m.batch, m.rows, *kv, kv_layer, result);
          break;
        }
        default:
          fail(PE_ERR_INTERNAL, "tensor-parallel message of unknown kind ", static_cast<int32_t>(m.kind));
      }
    }
  } catch (const std::exception& e) {
    comm.abort(std::string("rank ") + std::to_string(comm.rank()) + ": " + e.what());
    throw;
  }
}

}  // namespace pe
