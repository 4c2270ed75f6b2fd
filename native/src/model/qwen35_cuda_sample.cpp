// CUDA model, sampling: penalties, sampling and logprobs run on the device logits of the last
// forward; only the token ids (and requested logprobs) are copied back, in one transfer.
#ifdef PE_WITH_CUDA  // the CUDA model exists only in builds with the CUDA backend
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/model_glue.h"
#include "model/qwen35_cuda_parts.h"

namespace pe {
namespace {

bool has_penalties(const SampleJob& j) {
  return j.cfg.repetition_applies() || (j.cfg.counts_apply() && j.n_out > 0);
}

// Distinct ids of prompt + output (repetition penalty) and their output counts, as
// cpu::apply_penalties sees them. Ids outside the vocabulary are skipped like there.
void penalty_table(const SampleJob& j, int64_t V, std::vector<int32_t>& ids, std::vector<int32_t>& counts) {
  std::unordered_map<int32_t, int32_t> index;
  ids.clear();
  counts.clear();
  const bool rep = j.cfg.repetition_applies();
  auto add = [&](int32_t id, bool out) {
    if (id < 0 || id >= V) return;
    auto it = index.find(id);
    if (it == index.end()) {
      if (!rep && !out) return;
      it = index.emplace(id, static_cast<int32_t>(ids.size())).first;
      ids.push_back(id);
      counts.push_back(0);
    }
    if (out) ++counts[it->second];
  };
  for (int64_t i = 0; i < j.n_prompt; ++i) add(j.prompt[i], false);
  for (int64_t i = 0; i < j.n_out; ++i) add(j.out[i], true);
  // Without presence/frequency the counts must not subtract anything.
  if (!j.cfg.counts_apply()) std::fill(counts.begin(), counts.end(), 0);
}

}  // namespace

// Queues penalties, sampling and logprobs of every job, then one copy of the outputs into the
// launch's page-locked buffer; sample_collect waits for that copy alone. Logprobs read the sampled
// id on the device, so nothing waits for the host between the sampling and the next forward.
void CudaQwen35Model::sample_launch(const ForwardResult& res, const std::vector<SampleJob>& jobs) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  const int64_t V = cfg_.vocab, n = static_cast<int64_t>(jobs.size());
  if (samples_launched_ - samples_collected_ >= kMaxPendingSamples)
    fail(PE_ERR_INTERNAL, "sample_launch: ", kMaxPendingSamples, " launches are already waiting to be collected");
  if (n > 0 && !last_logits_) fail(PE_ERR_STATE, "sample before any forward");
  if (n > cap_rows_) fail(PE_ERR_INTERNAL, "sample: ", n, " jobs but the last forward had ", cap_rows_, " rows");
  cudaStream_t st = cuda::stream();
  // sample_out_: tokens [rows] | logprob [rows] | top ids [rows, 20] | top logprobs [rows, 20]
  int32_t* d_tok = sample_out_.as<int32_t>();
  float* d_lp = reinterpret_cast<float*>(d_tok + cap_rows_);
  int32_t* d_top = reinterpret_cast<int32_t*>(d_lp + cap_rows_);
  float* d_top_lp = reinterpret_cast<float*>(d_top + cap_rows_ * PE_MAX_TOP_LOGPROBS);
  std::vector<int32_t> ids, counts;
  bool any_lp = false;
  for (int64_t i = 0; i < n; ++i) {
    const SampleJob& j = jobs[i];
    const float* row = last_logits_ + j.row * V;
    const float* src = row;
    if (has_penalties(j)) {
      penalty_table(j, V, ids, counts);
      const size_t need = 2 * ids.size() * sizeof(int32_t);
      if (penalty_ids_.size() < need) penalty_ids_ = Buffer(Device::CUDA, std::max<size_t>(need, 1 << 16));
      ids.insert(ids.end(), counts.begin(), counts.end());
      mem_upload(Device::CUDA, penalty_ids_.data(), ids.data(), need);
      float* pen = penalty_row_.as<float>();
      mem_copy(Device::CUDA, pen, row, sizeof(float) * V);
      const int32_t m = static_cast<int32_t>(counts.size());
      cuda::apply_penalties(pen, penalty_ids_.as<int32_t>(), penalty_ids_.as<int32_t>() + m, m, j.cfg, st);
      src = pen;
    }
    if (j.allowed && token_mask_allows_any(j.allowed, V)) {
      // Grammar mask: on the penalized row, or on a copy of the raw one (logprobs stay raw).
      const size_t words = static_cast<size_t>((V + 31) / 32) * sizeof(uint32_t);
      if (token_mask_.size() < words) token_mask_ = Buffer(Device::CUDA, words);
      mem_upload(Device::CUDA, token_mask_.data(), j.allowed, words);  // stream-ordered, host reusable
      float* pen = penalty_row_.as<float>();
      if (src != pen) mem_copy(Device::CUDA, pen, row, sizeof(float) * V);
      cuda::apply_token_mask(pen, V, token_mask_.as<uint32_t>(), st);
      src = pen;
    }
    cuda::sample(src, V, j.cfg, j.u, d_tok + i, sample_scratch_.data(), sample_scratch_.size(), st);
    if (j.n_logprobs >= 0) {
      any_lp = true;
      cuda::logprobs(row, V, d_tok + i, j.n_logprobs, d_lp + i, d_top + i * PE_MAX_TOP_LOGPROBS,
                     d_top_lp + i * PE_MAX_TOP_LOGPROBS, st);
    }
  }
  PendingSample& p = samples_[samples_launched_ % kMaxPendingSamples];
  // The slot's previous launch was collected (the count above), so its copy is done.
  const size_t bytes = any_lp ? sample_out_.size() : sizeof(int32_t) * std::max<int64_t>(n, 1);
  if (p.host.size() < sample_out_.size()) p.host = cuda::PinnedBuffer(sample_out_.size());
  if (n > 0) cuda::download_async(p.host, sample_out_.data(), bytes);
  p.done.record();
  p.rows = cap_rows_;
  p.n_logprobs.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p.n_logprobs[i] = jobs[i].n_logprobs;
  ++samples_launched_;
  last_sample_jobs_ = n;
}

void CudaQwen35Model::sample_collect(std::vector<SampleOut>& outs) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  if (samples_collected_ == samples_launched_) fail(PE_ERR_INTERNAL, "sample_collect: nothing was launched");
  PendingSample& p = samples_[samples_collected_++ % kMaxPendingSamples];
  const int64_t n = static_cast<int64_t>(p.n_logprobs.size());
  outs.assign(static_cast<size_t>(n), SampleOut{});
  p.done.wait();
  const int32_t* tok = p.host.as<int32_t>();
  const float* lp = reinterpret_cast<const float*>(tok + p.rows);
  const int32_t* top = reinterpret_cast<const int32_t*>(lp + p.rows);
  const float* top_lp = reinterpret_cast<const float*>(top + p.rows * PE_MAX_TOP_LOGPROBS);
  for (int64_t i = 0; i < n; ++i) {
    outs[i].token = tok[i];
    const int32_t k = p.n_logprobs[i];
    if (k < 0) continue;
    outs[i].logprob = lp[i];
    std::copy_n(top + i * PE_MAX_TOP_LOGPROBS, k, outs[i].top_ids);
    std::copy_n(top_lp + i * PE_MAX_TOP_LOGPROBS, k, outs[i].top_logprobs);
  }
}

}  // namespace pe

#endif  // PE_WITH_CUDA
