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
#pragma once
#include <memory>

#include "model/model.h"

namespace pe {

std::unique_ptr<Model> make_cuda_model(const ModelConfig& cfg);

}  // namespace pe
