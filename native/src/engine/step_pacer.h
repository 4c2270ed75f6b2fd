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
// - with decode rows: the predicted time of the step with the least whole blocks of prefill (with a
//   row tile: the least whole tiles of the step's rows) at which the long prefill keeps
//   kDerivedPrefillShare (80 %) of its rate alone in full chunks. With t = base + c * tokens that
//   slice is about 4 x the decode rows' time / c and the step about 5 decode steps: decoding requests
//   get a token every ~5 decode steps' time instead of every chunk's. What a step pays for holding
//   prefill at all is in the model, so where slices cost more per token than full chunks the slice
//   grows to keep the share. Where no slice can keep it (the decode rows cost over a fifth of a full
//   chunk, or the device runs mixed steps that much slower), the step is the least whole blocks that
//   take 80 % of its time, about 5 x the decode rows' time: pacing bounded by the decode step rather
//   than off.
// - without: the predicted time of the prompts that end in the step, so the long prefill gets its
//   one-block minimum beside them. Such a step comes once per arriving request (which decodes
//   after it), so the prefill loses little, and the new request's first token waits for nothing
//   but the step in flight.
//
// Headroom (design decision): a fixed limit is a promise about the decoding requests' inter-token
// time, and the linear model's errors put a few percent of paced steps over it (the 27B on an
// H100 at 60 ms: ITL p99 60.2 and 61.2 ms with 1 and 4 decoding). fit therefore compares the
// predictions times the 98th percentile of the last kResiduals paced steps' measured / predicted
// times (at least 1, at most kMaxHeadroom; while fewer than 50 are seen, that is the largest:
// waiting for 16 before taking any, an H200 at 60 ms ran 7 of 106 steps over it, ITL p99 62.1 ms;
// from the first, an H100 ran none of 111 over it, p99 58.9 ms, both with 1 decoding) with a fixed
// limit. A derived limit is itself a prediction of the slice it was derived for and takes none.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/step_cost.h"

namespace pe {

class StepPacer {
 public:
  static constexpr double kDerivedPrefillShare = 0.8;  // derived limits: of the full-chunk rate
  static constexpr size_t kResiduals = 128;
  static constexpr double kMaxHeadroom = 1.25;
  static constexpr double kMinTileFill = 0.625;  // of a row tile's rows, for fit to keep it

  // max_step_ms > 0: a fixed limit; 0: derived per step (above). page_size: chunks are cut at KV
  // block boundaries, where prefix-cache snapshots are taken (a snapshot inside a chunk splits its
  // GDN work).
  // slow_rows (Model::slow_rows): step rows strictly between them run a much slower matmul path
  // than the upper bound does; fit grows a slice that would leave its step there up to the bound.
  // row_tile (Model::row_tile; 0: none): the prefill matmuls' token tile, fit's cut unit (below).
  // block_cuts: with a row tile, cuts stay at block boundaries too (the prefix cache is on: a
  // prompt chunk that ends inside a block takes a snapshot at its last boundary for a cancelled
  // prefill to resume from, a cut of its conv and GDN work).
  StepPacer(const StepCost& cost, double max_step_ms, int64_t chunked_prefill_size, int64_t page_size,
            std::pair<int64_t, int64_t> slow_rows = {0, 0}, int64_t row_tile = 0, bool block_cuts = true);

  // Paces only once the model rests on measurements.
  bool active() const { return cost_.ready(); }
  const StepCost& cost() const { return cost_; }

  // The time limit (seconds) of a step holding `fixed` whose paced prefill chunk starts after
  // n_past tokens of its sequence (the derived limit counts that chunk's attention depth).
  double limit_seconds(const StepShape& fixed, int64_t n_past) const;

  // Tokens (<= n_max) of a prefill chunk after n_past tokens that keep a step of `so_far` plus the
  // chunk within limit_s, cut at a block boundary. must_progress: at least up to the next block
  // boundary, even over the limit (the step's first prefill chunk: a limit that decode rows alone
  // exceed must not starve the prefill). A cut that would leave the step's rows in the slow gap is
  // grown to its upper bound, over the limit (design decision: below it the matmuls run several
  // times slower per token -- the 27B on an H100, a 100-token slice beside 4 decode rows took the
  // mma.sync GEMM: steps of up to 580 ms under a 60 ms limit, the prefill at 19 % -- and a step at
  // the bound costs about what the slice would have: the weights' read).
  // With a row tile (design decision, measured on the 27B shape on an H100 with
  // tools/gpu/lab/step_sweep.py): a step costs about the same from 129 to 256 rows and jumps ~10 ms
  // past each multiple of 128 (the FP8 GEMM's token tile over 64 layers): a 512-token chunk beside
  // one decode row took 75.9 ms against 61.2 ms alone, and 383 tokens beside it what 384 take
  // alone. The linear cost model cannot see the staircase, so fit drops a last tile that is less
  // than kMinTileFill full (keeping r rows of it pays only when r > 128 c n / (F + c n), c the
  // matmuls' cost per token, F the step's fixed cost, n the tokens below it: half to two thirds of
  // a tile on the 27B), the same for a chunk of n_max that does not end its prompt (`last` false).
  // Without block_cuts the cut is exact (the step's rows end at the tile); with them, at the block
  // boundary at or below.
  int64_t fit(const StepShape& so_far, int64_t n_past, int64_t n_max, double limit_s, bool must_progress,
              bool last = true) const;

  // A paced step's predicted and measured seconds (the engine, after each paced step).
  void observe(double predicted_s, double measured_s);
  // What fit multiplies predictions by under a fixed limit (header).
  double headroom() const { return headroom_; }

 private:
  const StepCost& cost_;
  double max_step_s_;
  int64_t chunk_;
  int64_t page_;
  std::pair<int64_t, int64_t> slow_;
  int64_t tile_;
  bool blocks_;
  std::array<double, kResiduals> ratios_{};  // measured / predicted, a ring
  size_t n_ratios_ = 0;
  double headroom_ = 1.0;
  std::vector<double> sorted_;  // observe's scratch
};

}  // namespace pe
