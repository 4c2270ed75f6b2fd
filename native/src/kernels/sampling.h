// Sampling and logprobs on fp32 logits of one sequence (CPU reference).
//
// Randomness is counter based: the caller draws u = uniform_at(seed, index) for the index of the
// token being sampled, so the same seed gives the same tokens whatever the batch or step layout.
#pragma once
#include <cstdint>

namespace pe {

struct SamplingConfig {
  float temperature = 0.0f;   // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;          // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off (keep tokens with p >= min_p * p_max)
  float presence_penalty = 0.0f;    // on generated tokens (OpenAI semantics)
  float frequency_penalty = 0.0f;   // on generated tokens, times their count
  float repetition_penalty = 1.0f;  // on prompt + generated tokens (HF/vLLM semantics)
  uint64_t seed = 0;

  // The penalties that change logits, each read from the token history: the repetition penalty
  // (prompt + output ids) and the presence / frequency penalties (output counts).
  bool repetition_applies() const { return repetition_penalty != 1.0f && repetition_penalty > 0.0f; }
  bool counts_apply() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f; }
  bool any_penalty() const { return repetition_applies() || counts_apply(); }
};

// A uniform float in [0, 1) from (seed, counter): splitmix64-style hash, stateless.
float uniform_at(uint64_t seed, uint64_t counter);

// Whether a grammar token mask (bit t % 32 of allowed[t / 32] = token t) allows any of [0, V).
bool token_mask_allows_any(const uint32_t* allowed, int64_t V);

namespace cpu {

// In place on logits[V]: repetition penalty over tokens in prompt_ids or out_ids
// (logit > 0 ? logit / rp : logit * rp), then presence and frequency penalties over out_ids.
void apply_penalties(float* logits, int64_t V, const SamplingConfig& p, const int32_t* prompt_ids,
                     int64_t n_prompt, const int32_t* out_ids, int64_t n_out);

// In place on logits[V]: -inf for every token whose bit (t % 32) of allowed[t / 32] is clear (a
// grammar's token mask). A mask that allows no token leaves the logits unchanged (a grammar in
// an error state must not turn the sampling into NaNs).
void apply_token_mask(float* logits, int64_t V, const uint32_t* allowed);

// Picks a token from logits[V] (not modified): greedy when temperature == 0, otherwise
// softmax(logits / T), then top-k, then top-p (smallest set with mass >= top_p), then min-p,
// renormalized, and inverse-CDF with u in [0, 1). scratch: V floats, scratch_idx: V ints.
int32_t sample(const float* logits, int64_t V, const SamplingConfig& p, float u, float* scratch,
               int32_t* scratch_idx);

// The distribution sample() draws from: probs[V] = the kept tokens' weights after temperature,
// top-k, top-p and min-p, normalized, 0 elsewhere; greedy (temperature 0, top_k 1): one-hot at the
// argmax. With u uniform in [0, 1), sample() returns token i with probability probs[i] (up to
// float rounding). scratch_idx: V ints.
void sample_probs(const float* logits, int64_t V, const SamplingConfig& p, float* probs, int32_t* scratch_idx);

// Lossless speculative verify of one sequence's k drafts (standard rejection sampling): p [k + 1, V]
// is the target's sampling distribution (sample_probs) at each draft position and after the last,
// each row computed with the drafts before it in the token history (penalties); q [k, V] the
// drafter's distributions, or null for point-mass drafts (argmax proposers: q = one-hot at the
// draft). Draft i is accepted when u_accept[i] * q(x_i) < p(x_i) (probability min(1, p / q)),
// stopping at the first rejection; the next token is then drawn with u_sample from max(0, p - q)
// normalized, or, when all k were accepted, from p's last row (the bonus token). The output has
// the target's distribution whatever q is; at temperature 0 it is exactly greedy decoding.
// residual: V floats of scratch.
struct SpecVerifyResult {
  int32_t n_accepted = 0;  // drafts kept, 0 .. k
  int32_t next = 0;        // the token after them
};
SpecVerifyResult spec_verify(const float* p, const float* q, const int32_t* drafts, int64_t k, int64_t V,
                             const float* u_accept, float u_sample, float* residual);

// log_softmax(logits)[token] -> *token_logprob, and the n_top most likely (ids, logprobs),
// descending, ties by lower id. n_top may be 0.
void logprobs(const float* logits, int64_t V, int32_t token, int32_t n_top, float* token_logprob,
              int32_t* top_ids, float* top_logprobs);

}  // namespace cpu
}  // namespace pe
