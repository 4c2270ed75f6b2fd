// The Qwen3.5 hybrid model on a CUDA GPU (built only with the CUDA backend).
//
// Same forward as the CPU reference (qwen35.cpp), with every tensor on the device: weights are
// uploaded at finalize (optionally quantized first) or generated there (load_dummy), activations
// live in one workspace reserved for the largest step, KV pages and GDN slots are device pools,
// and sampling runs on the device so only token ids and requested logprobs come back.
//
// Design decision (fused projections): matrices that read the same input are concatenated by rows
// at load time: MLP gate|up, GDN in_proj qkv|z|a|b and attention q|k|v. One GEMV then streams
// all of them, which is what batch-1 decode needs (fewer launches, long rows of work). FP8 block
// scales allow a cut only at a multiple of the block, so a checkpoint whose shapes do not line up
// keeps those matrices apart (same answers, one more launch).
//
// Design decision (launches per decode step): a batch-1 step of a big model is ~1,000 launches,
// many tiny, each costing GPU time between kernels. Glue is fused where it costs no accuracy:
// every residual add runs with the norm after it (add_rms_norm), the attention inputs (q/gate
// split, q/k norms, RoPE, dense k/v) are one launch, single-row steps skip the dense-row copies
// (a lone row has no stride to fix), and decode logits are read from the hidden rows in place.
// 27B shape (48 GDN + 16 attention layers), batch 1: 1,093 stream operations -> 708.
// Decode steps with quantized weights go further: the residual add and the norm after it are
// split over the GEMVs around them (cuda_ops.h SplitNorm; the out projection or down adds into
// the residual, the next projection applies the 1 / rms), so 127 of the 129 norm launches are gone
// (session 15, H200, 27B batch 1, PYENGINE_SPLIT_NORM=1 / 0, two rounds: 8.699 / 8.697 against
// 8.953 / 8.937 ms a step).
//
// Design decision (cuda_graphs, off by default): with the engine option on, a decode-only step
// (one token per sequence, no GDN snapshot inside a chunk, device outputs) runs as a CUDA graph.
// The host work and the upload of ids, positions and page tables come first (and the end-of-step
// snapshot copies after);
// then the step's launches are stream-captured, applied to the cached executable graph of that
// shape (tokens, logit rows) with cudaGraphExecUpdate, re-instantiated when the update is refused
// (e.g. attention adds its split-K combine pass as the context grows), and launched. Kernels take
// positions, lengths and split counts as arguments, so every step is captured anew: the capture
// costs host time about like launching, and the gain is the GPU-side gap between kernels. The
// first step of a shape runs uncaptured (kernels load outside a capture). Workspace is reserved
// before (reserve / ensure_workspace), so nothing in a captured step allocates, synchronizes or
// copies from the host; a capture that fails anyway is ended and reported as pe::Error, and the
// engine fails that step's requests and keeps serving. Code: kernels/cuda/step_graphs.cu.
// Measured on an H200 (tools/bench_gpu.py --cuda-graphs): no gain yet, 0.95-1.1x of eager (27B
// batch 1: 16.5 vs 16.1 ms; embedded model batch 8: 0.98 vs 0.85 ms), since the capture and update
// cost about what they save. Replays without a capture need the per-step scalars (positions,
// lengths, split counts) read from device memory by kv_write and attention: the next step.
#pragma once
#include <memory>

#include "model/model.h"

namespace pe {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& cfg);

}  // namespace pe
