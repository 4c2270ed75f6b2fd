// Speculative decoding's drafters behind one interface, so the engine's loop (draft, verify in the
// normal step, roll back) is the same for the MTP head and a DFlash draft model.
//
// After every step the engine hands the proposer each sequence the step computed: the rows of
// the step's batch holding its newly committed tokens (their hidden states are kept by the target,
// Batch::keep_hidden with the proposer's hidden_layers(), layer-major) and how many drafts it
// wants after them.
// A proposer that keeps its own per-token state (the MTP head's KV, a DFlash draft's context KV)
// brings it up to date over those rows for every sequence, drafting or not, so its cache covers
// every computed token (prefix-cache pages are shared by requests that draft and ones that don't).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "model/model.h"

namespace pe {

struct ProposeInput {
  Request* req;
  int64_t pos0 = 0;         // position of the first token committed this step
  int64_t n_rows = 0;       // tokens committed this step (positions pos0 .. pos0 + n_rows - 1)
  int32_t hidden_row0 = 0;  // the step batch's row holding position pos0 (kept hidden rows)
  int32_t n_drafts = 0;     // drafts wanted after the request's last token (0: bring state up only)
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // The target's hidden states the proposer reads (Batch::keep_hidden): -1 the final-normed rows,
  // i the output of decoder layer i.
  virtual std::vector<int32_t> hidden_layers() const = 0;
  // Rows past a request's computed tokens its next propose writes when it drafts n (its pages must
  // cover them): the MTP chain's 1 + n; a DFlash block's block_size whatever n.
  virtual int64_t rows_ahead(int64_t n_drafts) const { return 1 + n_drafts; }
  // The most drafts one propose gives a request.
  virtual int64_t max_drafts() const = 0;
  // Fills req->drafts (at most n_drafts; fewer when its pages end first) and req->draft_probs
  // for the inputs that want drafts. The KV pages of every request cover n_computed + 1 +
  // n_drafts tokens on entry.
  virtual void propose(const std::vector<ProposeInput>& in) = 0;
};

// Appends draft j (0-based) of r from the drafter's logits row [V]: at temperature 0 its argmax
// (lowest id on ties; q one-hot), else a sample of the drafter's distribution under the request's
// temperature, top-k, top-p and min-p (no penalties), from the request's own draft stream, with
// that distribution as row j of r.draft_probs (q of the lossless verify). idx: V ints of scratch.
void pick_draft(Request& r, const float* logits, int64_t V, int64_t j, std::vector<int32_t>& idx);

// Argmax jobs of rows 0 .. n - 1 (the default SamplingConfig: pick_draft's T = 0 choice, lowest id
// on ties), for drafts sampled where the drafter's logits are (Model / DFlashDraft::sample_launch).
void argmax_jobs(int64_t n, std::vector<SampleJob>& jobs);

// The seeds of a request's draft samples and its verify's acceptance tests: streams of their own,
// so a seeded request draws the same numbers whatever the batch.
uint64_t draft_seed(uint64_t seed);
uint64_t accept_seed(uint64_t seed);

}  // namespace pe
