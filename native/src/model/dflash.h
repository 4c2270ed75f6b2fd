// The DFlash draft model (MODEL_SPEC §6): a block-diffusion drafter that proposes block_size - 1
// tokens in one forward, conditioned on the target's hidden states after the layers
// target_layer_ids, on any backend (the ops of backend.h, as the target's forward).
//
// Per draft step of one sequence whose committed tokens are 0 .. S:
//   context rows: features [n_new, n_feat * H] of the newly committed positions (the target's
//     layer outputs, concatenated in target_layer_ids order) -> C = hidden_norm(fc(features)) ->
//     per layer k_norm(k_proj C) (RoPE at their positions) and v_proj C appended to the draft's
//     own paged KV cache, so the context grows incrementally and is never recomputed;
//   block: [token S, MASK x (bs - 1)] at positions S .. S + bs - 1, embedded with the target's
//     table; per layer x = input_layernorm(h), q = q_norm(q_proj x), the block's k / v from x
//     written to the cache rows S .. S + bs - 1, non-causal attention of the block over every
//     cached row 0 .. S + bs - 1 (Backend::attention_blocks), o_proj, residual, SwiGLU MLP;
//   logits of block rows 1 .. bs - 1 = the target's lm_head(norm(h)): row j proposes token S + j.
// Norms are Qwen3's (w * x / rms), RoPE full head_dim NeoX, attention ungated.
//
// Design decision (the block's K/V in the cache): the block's keys and values are written to the
// rows after the context, so one paged attention covers context and block; the next step's context
// rows overwrite them (its context starts where this block started). A sequence's page table
// must therefore cover n_context + n_new + block_size rows.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cache/cache_shape.h"
#include "cache/kv_pool.h"
#include "model/backend.h"
#include "model/qwen35.h"
#include "pyengine.h"

namespace pe {

struct DFlashConfig {
  int64_t hidden = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float eps = 1e-6f, rope_theta = 10000.0f;
  int64_t block_size = 0;
  int32_t mask_token = 0;
  std::vector<int32_t> target_layers;  // 0-based target decoder layers, in feature order

  int64_t n_features() const { return static_cast<int64_t>(target_layers.size()); }
  // The draft's KV cache: one attention layer per draft layer.
  CacheShape cache_shape() const;
  // Validates against the target (hidden size and vocabulary shared, layer ids in range); throws
  // pe::Error (INVALID_ARGUMENT) naming the field.
  static DFlashConfig from_c(const pe_draft_config& c, const ModelConfig& target);
};

// One sequence of a draft step.
struct DraftSeq {
  int64_t n_context = 0;            // context rows already in the draft's cache (positions 0 ..)
  int64_t n_new = 0;                // context rows appended by this step
  // Target features of the new rows on the draft's device: feature j (target_layers[j]) of new
  // row t at features + j * layer_stride + t * row_stride, hidden floats each. Token-major rows
  // [n_new, n_features * hidden] are layer_stride = hidden, row_stride = n_features * hidden; the
  // rows a target forward kept (Batch::keep_hidden, layer-major) are layer_stride = kept rows *
  // hidden, row_stride = hidden.
  const float* features = nullptr;
  int64_t layer_stride = 0;
  int64_t row_stride = 0;
  bool draft = true;                // false: only append the context rows (no block, no logits)
  int64_t n_logits = -1;            // block rows 1 .. n_logits get logits (-1: all block_size - 1);
                                    // the block runs whole through the layers either way
  int64_t logit_rows(int64_t block_size) const { return n_logits < 0 ? block_size - 1 : n_logits; }
  int32_t last_token = 0;           // the block's first token, at position n_context + n_new
  const int32_t* page_table = nullptr;  // host; pages covering n_context + n_new (+ block_size) rows
};

class DFlashDraft {
 public:
  // The draft runs on the target's device with its own backend and workspace; the target (whose
  // embedding and lm_head it reads) must be finalized first and outlive it. Tensor parallel
  // targets are refused (their lm_head is a vocabulary shard).
  DFlashDraft(const DFlashConfig& cfg, const Qwen35Model& target);
  ~DFlashDraft();

  const DFlashConfig& config() const { return cfg_; }
  Device device() const { return be_->device(); }
  WeightStore& weights() { return weights_; }
  // On-load quantization of the draft's matrices (I8, FP8_E4M3, NVFP4; F32 = off), before finalize.
  void set_weight_quant(DType target);
  // Validates (the first missing tensor named), quantizes and places the weights.
  void finalize();
  int64_t weight_bytes() const { return be_->weight_bytes(weights_); }
  // Sizes the workspace for steps of up to ctx_rows new context rows and n_blocks blocks over
  // contexts of up to max_context rows in pages of page_size (the engine's largest step), so its
  // steps allocate nothing.
  void reserve(int64_t ctx_rows, int64_t n_blocks, int64_t max_context, int64_t page_size);

  // One draft step over sequences (each in its own cache rows of kv, a pool of cache_shape() on the
  // draft's device): appends their new context rows, then drafts the block of every sequence with
  // `draft`. res.logits (host when host_outputs, else on the device for sample_launch) holds
  // n_logits rows per drafting sequence, in order (res.logit_row_begin; -1 for the others);
  // with host_outputs res.hidden holds the final-normed hidden states of those rows. Calls are
  // serialized inside (one workspace).
  void forward(const std::vector<DraftSeq>& seqs, KvPool& kv, bool host_outputs, ForwardResult& res);
  // Sampling from the latest forward's logits (Model::sample_launch semantics): temperature-0 jobs
  // give the greedy proposals without moving the logits to the host.
  void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs);
  void sample_collect(std::vector<SampleOut>& outs);

 private:
  struct Layer {
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    Projection q, kv, o, gate_up, down;  // kv: k_proj | v_proj
  };
  // Host ints of a step, uploaded in one copy (dflash_forward.cpp).
  struct Step {
    int64_t T_ctx = 0, T_blk = 0;
    std::vector<int64_t> drafting;       // the sequences with a block, in order
    const int32_t* ids = nullptr;        // block tokens [T_blk]
    const int32_t* pos_ctx = nullptr;    // [T_ctx]
    const int32_t* pos_blk = nullptr;    // [T_blk]
    const int32_t* rows_ctx = nullptr;   // cache rows [T_ctx]
    const int32_t* rows_blk = nullptr;   // cache rows [T_blk]
    const int32_t* pages = nullptr;      // page tables, drafting sequence i's at page_off[i]
    std::vector<int64_t> page_off;
    // The context features gathered in one op (Backend::embedding of an F32 table of hidden-wide
    // rows from feat_base): row ids [T_ctx * n_features], token-major; null where the sequences'
    // features share no such base (then copied per sequence and feature).
    const float* feat_base = nullptr;
    int64_t feat_rows = 0;
    const int32_t* feat_ids = nullptr;
    const int32_t* blk_ids = nullptr;    // the blocks' proposing rows (1 .. n_logits of each)
    std::vector<int64_t> starts;          // per drafting sequence: its block's first position
    std::vector<const int32_t*> page_tables;  // per drafting sequence: its page table (device)
    const int32_t* perm = nullptr;       // Backend::attention_blocks_perm
  };

  void declare_tensors();
  void prepare_step(const std::vector<DraftSeq>& seqs, const KvPool& kv, int64_t logit_rows);
  const float* feature_ids(const std::vector<DraftSeq>& seqs, std::vector<int32_t>& h);
  int64_t workspace_floats(int64_t T_ctx, int64_t n_blocks, bool gathered) const;
  void ensure_workspace(int64_t floats);
  void context_rows(const std::vector<DraftSeq>& seqs, KvPool& kv);
  const float* block_rows(const std::vector<DraftSeq>& seqs, KvPool& kv, float* logits, int64_t n_rows);
  float* take(int64_t floats);  // bump allocation in the workspace, reset per step

  DFlashConfig cfg_;
  ModelConfig shape_cfg_;  // the fields Backend::reserve / attention_scratch_bytes read
  const Qwen35Model& target_;
  std::unique_ptr<Backend> be_;
  WeightStore weights_;
  DType weight_quant_ = DType::F32;
  bool ready_ = false;
  Projection fc_;
  const float* hidden_norm_ = nullptr;
  const float* final_norm_ = nullptr;
  std::vector<Layer> layers_;
  Buffer work_;
  int64_t work_used_ = 0;
  std::vector<int32_t> host_ints_;
  Step step_;
  std::mutex mu_;
};

}  // namespace pe
