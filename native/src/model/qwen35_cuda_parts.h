// Internals of the CUDA model shared by its translation units: device weights, fused
// projections, the workspace and the class itself (see qwen35_cuda.h for the design).
#pragma once
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/step_graphs.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace pe {

// A weight matrix in device memory (view holds the device pointers).
struct DevMatrix {
  WeightView view;
  Buffer data, scales, group;
};

// Matrices that read the same input, concatenated by rows into runs. The output of run j is a
// dense [n, rows_j] block at out + n * run_offset[j]; part p of the projection is columns
// starting at part_col[p] of run part_run[p].
struct Projection {
  std::vector<DevMatrix> runs;
  std::vector<int64_t> run_offset;  // in floats per token
  std::vector<int32_t> part_run;
  std::vector<int64_t> part_col;
  int64_t width = 0;  // floats per token over all runs

  struct Part {
    float* ptr;
    int64_t stride;  // floats between tokens
  };
  Part part(size_t p, float* out, int64_t n) const {
    const DevMatrix& r = runs[part_run[p]];
    return {out + n * run_offset[part_run[p]] + part_col[p], r.view.rows};
  }
};

struct DevLayer {
  bool full = false;
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  Projection in;       // attention: q | k | v; GDN: qkv | z | a | b
  Projection gate_up;  // gate | up
  Projection down, out;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* conv = nullptr;  // [conv_dim, K]
  const float* dt_bias = nullptr;
  const float* A_log = nullptr;
  const float* norm = nullptr;
};

class CudaQwen35Model : public Model {
 public:
  explicit CudaQwen35Model(const ModelConfig& cfg);
  ~CudaQwen35Model() override;
  Device device() const override { return Device::CUDA; }
  void finalize() override;
  void load_dummy(DType matrix_dtype, uint64_t seed) override;
  void forward(const Batch& batch, KvPool& kv, GdnPool& gdn, ForwardResult& out) override;
  void sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs) override;
  void sample_collect(std::vector<SampleOut>& outs) override;
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override;
  int64_t weight_bytes() const override { return weight_bytes_; }

 private:
  // Weight placement (qwen35_cuda_weights.cpp).
  using MatrixSource = std::function<DevMatrix(const std::vector<std::string>& names)>;
  void build_layers(const MatrixSource& make, const std::function<const float*(const std::string&)>& vec);
  Projection projection(const std::vector<std::string>& names, const MatrixSource& make) const;
  DevMatrix upload_run(const std::vector<std::string>& names);
  DevMatrix dummy_run(const std::vector<std::string>& names, DType dtype, uint64_t seed);
  const float* keep_vector(Buffer&& b);

  // Forward pieces (qwen35_cuda.cpp).
  void ensure_workspace(int64_t tokens, int64_t rows, int64_t ints, size_t attn_scratch);
  // norm: x is a split norm's h (cuda_ops.h SplitNorm); add_norm: the projection is its producer
  // (out is not written; one run).
  void linear(const float* x, int64_t n, const Projection& p, float* out, const cuda::SplitNorm* norm = nullptr);
  void project_out(const float* x, int64_t n, const Projection& p, float* out, cuda::SplitNorm* add_norm);
  bool can_split_norm(const Projection& producer, const Projection& consumer, int64_t n) const;
  void gdn_chunks(const DevLayer& L, int64_t gi, const Batch& b, GdnPool& gdn, const Projection::Part& u,
                  const float* a_ptr, const float* b_ptr, int64_t ab_stride, float* y, float* g, float* beta, float* o);
  // in_norm / add_norm: the split norms before the first and after the last projection (or null).
  void mixer_gdn(const DevLayer& L, int64_t gi, const Batch& b, GdnPool& gdn, const float* x, float* out,
                 const cuda::SplitNorm* in_norm, cuda::SplitNorm* add_norm);
  void mixer_attention(const DevLayer& L, int64_t ai, const Batch& b, KvPool& kv, const float* x, float* out,
                       const cuda::SplitNorm* in_norm, cuda::SplitNorm* add_norm);
  void mlp(const DevLayer& L, int64_t n, const float* x, float* out, const cuda::SplitNorm* in_norm,
           cuda::SplitNorm* add_norm);
  void step_launches(const Batch& b, KvPool& kv, GdnPool& gdn, int64_t n_rows, float* logits);

  std::vector<DevLayer> layers_;
  DevMatrix embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<Buffer> vectors_;
  int64_t weight_bytes_ = 0;
  bool ready_ = false;

  // Workspace: activations [tokens], logits rows, int staging, attention and sampling scratch.
  Buffer act_, norm_partial_, logits_, logits_host_, ints_, attn_scratch_, gdn_scratch_, sample_scratch_, sample_out_, penalty_ids_, penalty_row_, token_mask_;
  int64_t cap_tokens_ = 0, cap_rows_ = 0, cap_ints_ = 0;
  const float* last_logits_ = nullptr;
  std::vector<int32_t> host_ints_;
  // The step's ints go up from page-locked staging, two in turn: a step's upload is queued behind
  // the previous step's work without the host waiting for it (overlapped steps, engine.h).
  struct Staging {
    cuda::PinnedBuffer host;
    cuda::StreamEvent consumed;  // the upload that reads `host` is done
  };
  Staging upload_[2];
  int upload_turn_ = 0;
  // Launched samplings not yet collected (FIFO): their outputs come back into `host`.
  struct PendingSample {
    cuda::PinnedBuffer host;
    cuda::StreamEvent done;
    int64_t rows = 0;                 // the output layout's row capacity (sample_out_)
    std::vector<int32_t> n_logprobs;  // per job
  };
  PendingSample samples_[kMaxPendingSamples];
  int64_t samples_launched_ = 0, samples_collected_ = 0;
  int64_t last_sample_jobs_ = 0;  // jobs of the latest launch (token_from_sample's range)
  std::vector<int64_t> page_table_off_;
  const int32_t* d_pos_ = nullptr;
  const int32_t* d_pages_ = nullptr;
  const int32_t* d_cache_rows_ = nullptr;  // per new token: its KV cache row (page * page_size + offset)
  const int32_t* d_slots_ = nullptr;  // GDN slot of each sequence
  cuda::StepGraphs graphs_;
  std::mutex forward_mu_;
};

}  // namespace pe
