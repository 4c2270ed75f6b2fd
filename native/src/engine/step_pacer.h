// Step pacing: a step's prefill share sized to a time limit with the step-cost model, so requests
// that are decoding keep getting tokens at a steady pace while a long prompt prefills
// (Sarathi-Serve's stall-free batching, with its token budget replaced by a measured time budget).
//
// Which steps are paced is the scheduler's call (scheduler.h): those that give some request a
// token. This class answers two questions for them: the step's time limit, and how many prefill
// tokens of a chunk fit under it.
//
// The limit is the engine option max_step_ms, or, when it is 0, derived per step from the cost
// model (design decision):
// - with decode rows: the predicted time of the step with the least whole blocks of prefill at
//   which the long prefill keeps kDerivedPrefillShare (80 %) of its rate alone in full chunks. With
//   t = base + c * tokens that slice is about 4 x the decode rows' time / c and the step about 5
//   decode steps: decoding requests get a token every ~5 decode steps' time instead of every
//   chunk's. What a step pays for holding prefill at all is in the model, so where slices cost more
//   per token than full chunks the slice grows to keep the share. Where no slice can keep it (the
//   decode rows cost over a fifth of a full chunk, or the device runs mixed steps that much
//   slower), the step is the least whole blocks that take 80 % of its time, about 5 x the decode
//   rows' time: pacing bounded by the decode step rather than off.
// - without: the predicted time of the prompts that end in the step, so the long prefill gets its
//   one-block minimum beside them. Such a step comes once per arriving request (which decodes
//   after it), so the prefill loses little, and the new request's first token waits for nothing
//   but the step in flight.
#pragma once
#include <cstdint>
#include <utility>

#include "engine/step_cost.h"

namespace pe {

class StepPacer {
 public:
  static constexpr double kDerivedPrefillShare = 0.8;  // derived limits: of the full-chunk rate

  // max_step_ms > 0: a fixed limit; 0: derived per step (above). page_size: chunks are cut at KV
  // block boundaries, where prefix-cache snapshots are taken (a snapshot inside a chunk splits its
  // GDN work).
  // slow_rows (Model::slow_rows): step rows strictly between them run a much slower matmul path
  // than the upper bound does; fit grows a slice that would leave its step there up to the bound.
  StepPacer(const StepCost& cost, double max_step_ms, int64_t chunked_prefill_size, int64_t page_size,
            std::pair<int64_t, int64_t> slow_rows = {0, 0});

  // Paces only once the model rests on measurements.
  bool active() const { return cost_.ready(); }
  const StepCost& cost() const { return cost_; }

  // The time limit (seconds) of a step holding `fixed` whose paced prefill chunk starts after
  // n_past tokens of its sequence (the derived limit counts that chunk's attention depth).
  double limit_seconds(const StepShape& fixed, int64_t n_past) const;

  // Tokens (<= n_max) of a prefill chunk after n_past tokens that keep a step of `so_far` plus the
  // chunk within limit_s, ending at a block boundary when cut. must_progress: at least up to the
  // next block boundary, even over the limit (the step's first prefill chunk: a limit that decode
  // rows alone exceed must not starve the prefill). A cut that would leave the step's rows in the
  // slow gap is grown to its upper bound, over the limit (design decision: below it the matmuls
  // run several times slower per token -- the 27B on an H100, a 100-token slice beside 4 decode
  // rows took the mma.sync GEMM: steps of up to 580 ms under a 60 ms limit, the prefill at 19 % --
  // and a step at the bound costs about what the slice would have: the weights' read).
  int64_t fit(const StepShape& so_far, int64_t n_past, int64_t n_max, double limit_s, bool must_progress) const;

 private:
  const StepCost& cost_;
  double max_step_s_;
  int64_t chunk_;
  int64_t page_;
  std::pair<int64_t, int64_t> slow_;
};

}  // namespace pe
