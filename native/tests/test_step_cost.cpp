// The step-cost model (engine/step_cost.h) and the pacer's arithmetic (engine/step_pacer.h),
// fed step times from a synthetic device whose true costs are known.
#include <random>

#include "check.h"
#include "engine/step_cost.h"
#include "engine/step_pacer.h"

using namespace pe;

namespace {

// A device: seconds = base + row * decode rows + step (a step with prefill) + token * prefill
// tokens + pair * attended pairs.
struct Device {
  double base = 0.004, row = 0.0005, step = 0.003, token = 0.0004, pair = 2e-8;
  double time(const StepShape& s) const {
    return base + row * static_cast<double>(s.decode_rows) + (s.prefill_tokens > 0 ? step : 0.0) +
           token * static_cast<double>(s.prefill_tokens) + pair * s.attended_pairs;
  }
};

StepShape decode_step(int64_t rows, int64_t depth) {
  StepShape s;
  for (int64_t i = 0; i < rows; ++i) s.add(depth, 1, true);
  return s;
}

// A mixed step: `rows` decoding requests at `depth`, one prefill chunk of n after n_past.
StepShape mixed_step(int64_t rows, int64_t n_past, int64_t n) { return decode_step(rows, 64).plus(n_past, n, false); }

bool near(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::fabs(b); }

}  // namespace

TEST(shape_counts_rows_tokens_and_causal_pairs) {
  StepShape s;
  s.add(10, 1, true);   // a decode row after 10 tokens: attends to 11 keys
  s.add(4, 3, false);   // 3 prompt tokens after 4: 5 + 6 + 7 keys
  CHECK_EQ(s.decode_rows, 1);
  CHECK_EQ(s.prefill_tokens, 3);
  CHECK_NEAR(s.attended_pairs, 11.0 + 18.0, 0.0);
}

TEST(nnls_matches_least_squares_when_that_is_feasible_and_clamps_otherwise) {
  using M = std::array<std::array<double, StepCostModel::kFeatures>, StepCostModel::kFeatures>;
  using V = std::array<double, StepCostModel::kFeatures>;
  M a{};
  V b{};
  // Diagonal system: the unconstrained solution is b_i / a_ii; a negative one becomes 0 and the
  // others keep their values (the coordinates are independent).
  const double diag[5] = {2.0, 4.0, 1.0, 8.0, 5.0}, rhs[5] = {1.0, -2.0, 3.0, 4.0, 0.0};
  for (int i = 0; i < 5; ++i) {
    a[i][i] = diag[i];
    b[i] = rhs[i];
  }
  auto w = nonnegative_least_squares(a, b);
  CHECK_NEAR(w[0], 0.5, 1e-6);
  CHECK_NEAR(w[1], 0.0, 0.0);
  CHECK_NEAR(w[2], 3.0, 1e-6);
  CHECK_NEAR(w[3], 0.5, 1e-6);
  // A coupled 2-variable system (others absent): x + y fitted with a negative y unconstrained.
  M c{};
  V d{};
  c[0][0] = 2.0, c[0][1] = c[1][0] = 1.0, c[1][1] = 1.0;  // data (1,1) -> 1, (1,0) -> 2
  d[0] = 3.0, d[1] = 1.0;                                 // LS: x = 2, y = -1
  w = nonnegative_least_squares(c, d);
  CHECK_NEAR(w[0], 1.5, 1e-6);  // y held at 0: x = mean of 1 and 2
  CHECK_NEAR(w[1], 0.0, 0.0);
}

TEST(fit_recovers_a_device_from_noisy_steps) {
  Device dev;
  StepCostModel m;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> rows(0, 8), tokens(1, 512), depth(0, 8000);
  std::normal_distribution<double> noise(1.0, 0.03);
  CHECK(!m.ready());
  for (int i = 0; i < 400; ++i) {
    const int64_t r = rows(rng);
    const StepShape s =
        i % 3 == 0 ? decode_step(std::max<int64_t>(1, r), depth(rng)) : mixed_step(r, depth(rng), tokens(rng));
    m.observe(s, dev.time(s) * noise(rng));
  }
  CHECK(m.ready());
  CHECK_EQ(m.n_observed(), 400);
  const auto& k = m.coefficients();
  CHECK(near(k[0], dev.base, 0.15));
  CHECK(near(k[1], dev.row, 0.3));
  CHECK(near(k[2], dev.step, 0.15));
  CHECK(near(k[3], dev.token, 0.05));
  CHECK(near(k[4] * 1e-6, dev.pair, 0.1));
  for (const StepShape& s : {decode_step(1, 100), mixed_step(1, 30000, 64), mixed_step(4, 0, 512)})
    CHECK(near(m.predict_seconds(s), dev.time(s), 0.05));
}

TEST(ready_needs_prefill_steps_and_a_second_size_or_a_decode_step) {
  Device dev;
  StepCostModel a, b;
  for (int i = 0; i < 5; ++i) a.observe(decode_step(1, 10), dev.time(decode_step(1, 10)));
  CHECK(!a.ready());  // nothing known about prefill
  a.observe(mixed_step(0, 0, 100), dev.time(mixed_step(0, 0, 100)));
  CHECK(a.ready());
  for (int i = 0; i < 5; ++i) b.observe(mixed_step(0, 512 * i, 512), dev.time(mixed_step(0, 512 * i, 512)));
  CHECK(!b.ready());  // one prefill size: the base cannot be told from the per-token cost
  b.observe(mixed_step(0, 4096, 256), dev.time(mixed_step(0, 4096, 256)));
  CHECK(b.ready());
}

TEST(long_decoding_does_not_erase_what_prefill_taught) {
  Device dev;
  StepCostModel m;
  for (int i = 0; i < 40; ++i) {
    StepShape s = mixed_step(i % 3, 64 * i, 32 + 16 * (i % 20));
    m.observe(s, dev.time(s));
    m.observe(decode_step(1 + i % 4, 64), dev.time(decode_step(1 + i % 4, 64)));
  }
  // 5000 decode steps of a device whose decode got 50 % slower: the decode cost follows, the
  // prefill cost stays (a plain forgetting factor of 0.98 would have kept 0.98^5000 of it).
  Device slow = dev;
  slow.base *= 1.5;
  slow.row *= 1.5;
  for (int i = 0; i < 5000; ++i) m.observe(decode_step(1 + i % 4, 64), slow.time(decode_step(1 + i % 4, 64)));
  CHECK(near(m.predict_seconds(decode_step(2, 64)), slow.time(decode_step(2, 64)), 0.05));
  CHECK(near(m.coefficients()[3], dev.token, 0.1));
}

TEST(a_long_paced_stretch_does_not_erase_what_full_chunks_cost) {
  // Small slices cost more per token than full chunks (here 1.6x: a shape the linear model cannot
  // follow). Thousands of paced steps must leave the full chunk's prediction near its measurements
  // (the derived step limit is a share of that rate), and the slices must be predicted as they run.
  Device dev;
  StepCostModel m;
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(1.0, 0.05);
  auto slice_time = [&](const StepShape& s) {
    return dev.time(s) + 0.6 * dev.token * static_cast<double>(s.prefill_tokens);
  };
  for (int i = 0; i < 20; ++i) {
    m.observe(decode_step(1, 64), dev.time(decode_step(1, 64)) * noise(rng));
    m.observe(mixed_step(0, 512 * i, 512), dev.time(mixed_step(0, 512 * i, 512)) * noise(rng));
  }
  for (int i = 0; i < 3000; ++i) {
    const StepShape s = mixed_step(1, 16 * i, 16 * (1 + i % 8));
    m.observe(s, slice_time(s) * noise(rng));
  }
  const StepShape full = mixed_step(0, 0, 512);
  CHECK(near(m.predict_seconds(full), dev.time(full), 0.1));
  // ... and the slices' own cost: what the pacer cuts them to.
  for (int64_t depth : {46000, 48000}) {  // where the recent slices ran
    const StepShape slice = mixed_step(1, depth, 64);
    CHECK(near(m.predict_seconds(slice), slice_time(slice), 0.1));
  }
}

TEST(a_regime_the_features_cannot_tell_apart_is_followed_by_its_class_scale) {
  // Mixed steps 30 % slower than the same work in decode-only and prefill-only steps (on the CPU
  // backend a step of few rows runs its matmuls less efficiently): each class predicted as it runs.
  Device dev;
  StepCostModel m;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int64_t> rows(1, 4), tokens(16, 128), depth(0, 8000);
  auto mixed_time = [&](const StepShape& s) { return 1.3 * dev.time(s); };
  for (int i = 0; i < 300; ++i) {
    const StepShape d = decode_step(rows(rng), depth(rng)), p = mixed_step(0, depth(rng), 512);
    const StepShape x = mixed_step(rows(rng), depth(rng), tokens(rng));
    m.observe(d, dev.time(d));
    m.observe(p, dev.time(p));
    m.observe(x, mixed_time(x));
  }
  CHECK(near(m.predict_seconds(decode_step(2, 3000)), dev.time(decode_step(2, 3000)), 0.05));
  CHECK(near(m.predict_seconds(mixed_step(0, 3000, 512)), dev.time(mixed_step(0, 3000, 512)), 0.05));
  CHECK(near(m.predict_seconds(mixed_step(2, 3000, 64)), mixed_time(mixed_step(2, 3000, 64)), 0.05));
}

TEST(one_mismeasured_step_moves_the_prediction_by_a_bounded_amount) {
  Device dev;
  StepCostModel m;
  for (int i = 0; i < 100; ++i) {
    StepShape s = i % 2 ? decode_step(1, 64) : mixed_step(1, 64 * i, 32 + i);
    m.observe(s, dev.time(s));
  }
  const StepShape s = mixed_step(1, 1000, 64);
  const double before = m.predict_seconds(s);
  m.observe(s, 100.0);  // the host stalled
  CHECK(m.predict_seconds(s) < 1.2 * before);
  // An overlapped step measured far too short (the host read the step before it late): relative
  // errors would give it a huge weight, the cap bounds it.
  m.observe(s, before * 1e-3, true);
  CHECK(m.predict_seconds(s) > 0.5 * before);
  for (int i = 0; i < 300; ++i) m.observe(s, 3.0 * dev.time(s));  // a lasting change is followed
  CHECK(near(m.predict_seconds(s), 3.0 * dev.time(s), 0.05));
}

namespace {
// A fixed cost model for the pacer.
struct FixedCost : StepCost {
  Device dev;
  double predict_seconds(const StepShape& s) const override { return dev.time(s); }
  bool ready() const override { return true; }
};
}  // namespace

TEST(fit_takes_the_most_tokens_under_the_limit_cut_at_a_block) {
  FixedCost cost;
  StepPacer pacer(cost, 20.0, 512, 16);
  const StepShape so_far = decode_step(2, 100);
  const double limit = pacer.limit_seconds(so_far, 0);
  CHECK_NEAR(limit, 0.020, 1e-12);
  // 4 + 1 + 3 ms fixed + 0.4 ms per token (+ pairs): 29 tokens fit, cut to 16 at a block boundary.
  CHECK(cost.predict_seconds(so_far.plus(0, 29, false)) <= limit);
  CHECK(cost.predict_seconds(so_far.plus(0, 30, false)) > limit);
  CHECK_EQ(pacer.fit(so_far, 0, 512, limit, false), 16);
  // After 10 tokens the cut ends at a block boundary (16 or 32 from the start).
  const int64_t m = pacer.fit(so_far, 10, 512, limit, false);
  CHECK_EQ((10 + m) % 16, 0);
  CHECK_EQ(m, 22);
  CHECK_EQ(pacer.fit(so_far, 0, 20, limit, false), 20);  // the whole rest fits: no cut
  // Over the limit already: nothing, or up to the next block boundary when it must progress.
  const StepShape full = decode_step(64, 100);
  CHECK_EQ(pacer.fit(full, 0, 512, limit, false), 0);
  CHECK_EQ(pacer.fit(full, 5, 512, limit, true), 11);
}

TEST(fit_grows_a_slice_out_of_the_slow_rows_gap) {
  // Rows in (8, 64) run a slow matmul path: a cut that would leave the step there grows to 64 rows,
  // over the limit; cuts at or below the gap's lower bound, the whole rest, and full chunks stay.
  FixedCost cost;
  StepPacer pacer(cost, 20.0, 512, 16, {8, 64});
  const StepShape so_far = decode_step(2, 100);
  const double limit = pacer.limit_seconds(so_far, 0);
  CHECK_EQ(pacer.fit(so_far, 0, 512, limit, false), 64);   // 16 tokens + 2 rows: grown to 62, ends at block 64
  CHECK_EQ(pacer.fit(so_far, 10, 512, limit, false), 70);  // 22 + 2 rows: grown to 62, ends at position 80
  CHECK_EQ(pacer.fit(so_far, 0, 20, limit, false), 20);    // the whole rest: as it is
  StepPacer narrow(cost, 20.0, 512, 16, {32, 64});
  CHECK_EQ(narrow.fit(so_far, 0, 512, limit, false), 16);  // 18 rows: below the gap
  StepPacer none(cost, 20.0, 512, 16);
  CHECK_EQ(none.fit(so_far, 0, 512, limit, false), 16);
}

TEST(fit_drops_a_last_row_tile_it_would_fill_less_than_kMinTileFill) {
  // A 128-token row tile (the GEMMs' on CUDA): under a limit that lets n* tokens in, a last tile
  // of the step's rows filled less than 5/8 is dropped (exactly, or at the block boundary at or
  // below with block cuts); a chunk of n_max that does not end its prompt is cut the same way
  // (512 beside one decode row: 511), one that ends it is not; below one tile, and where the
  // step must progress, the cuts are the limit's.
  FixedCost cost;
  StepPacer exact(cost, 200.0, 512, 16, {0, 0}, 128, false);
  StepPacer blocks(cost, 200.0, 512, 16, {0, 0}, 128, true);
  const StepShape one = decode_step(1, 100), four = decode_step(4, 100);
  auto upto = [&](const StepShape& s, int64_t n_past, int64_t n) { return cost.predict_seconds(s.plus(n_past, n, false)); };
  CHECK_EQ(exact.fit(one, 0, 512, upto(one, 0, 419), false), 383);  // rows 420: 36 of the last tile
  CHECK_EQ(exact.fit(one, 0, 512, upto(one, 0, 469), false), 469);  // rows 470: 86 of it, kept
  CHECK_EQ(exact.fit(one, 5, 512, upto(one, 5, 419), false), 383);  // off a block boundary
  CHECK_EQ(blocks.fit(one, 0, 512, upto(one, 0, 469), false), 464);  // 465 rows: 81 of the tile
  CHECK_EQ(blocks.fit(one, 0, 512, upto(one, 0, 419), false), 368);  // 417 rows: to 384, a block below
  CHECK_EQ(blocks.fit(one, 5, 512, upto(one, 5, 419), false), 379);  // ends at 384 = 24 blocks
  CHECK_EQ(exact.fit(one, 0, 512, 1.0, false, false), 511);
  CHECK_EQ(blocks.fit(one, 0, 512, 1.0, false, false), 496);
  CHECK_EQ(exact.fit(one, 0, 512, 1.0, false, true), 512);
  CHECK_EQ(exact.fit(four, 0, 300, 1.0, false, true), 300);
  CHECK_EQ(exact.fit(four, 0, 300, 1.0, false, false), 252);  // rows 304: 48 of the last tile
  const StepShape two = decode_step(2, 100);
  CHECK_EQ(exact.fit(two, 0, 512, 0.020, false), 29);  // 31 rows: under one tile
  CHECK_EQ(blocks.fit(two, 0, 512, 0.020, false), 16);
  CHECK_EQ(exact.fit(decode_step(64, 100), 5, 512, 0.020, true), 11);  // over the limit: to the block
}

TEST(derived_limit_with_a_row_tile_is_a_step_of_whole_tiles_at_80_percent_of_the_full_chunk_rate) {
  FixedCost cost;
  for (bool block_cuts : {false, true}) {
    StepPacer pacer(cost, 0.0, 512, 16, {0, 0}, 128, block_cuts);
    for (int64_t rows : {1, 4, 8}) {
      for (int64_t depth : {0, 4096, 30000, 30005}) {
        const StepShape fixed = decode_step(rows, 200);
        const double limit = pacer.limit_seconds(fixed, depth);
        const int64_t p = pacer.fit(fixed, depth, 512, limit, false, false);
        const double alone_rate = 512.0 / cost.predict_seconds(StepShape{}.plus(depth, 512, false));
        auto rate = [&](int64_t n) { return static_cast<double>(n) / cost.predict_seconds(fixed.plus(depth, n, false)); };
        const int64_t part = (rows + p) % 128;
        if (block_cuts) {
          CHECK_EQ((depth + p) % 16, 0);
          CHECK(part == 0 || part > 128 - 16);
        } else {
          CHECK_EQ(part, 0);
        }
        CHECK(rate(p + (part ? 128 - part : 0)) >= 0.8 * alone_rate);  // its tiles, full, keep the share
        CHECK(p <= 128 || rate(p - 128) < 0.8 * alone_rate);          // one tile less would not
      }
    }
  }
}

TEST(a_fixed_limit_keeps_headroom_for_the_overrun_of_recent_paced_steps) {
  // Paced steps ran 10 % over their predictions (one outlier at 3x): fit keeps predictions x 1.1
  // under a fixed limit (while few are seen, the largest overrun); where steps ran under, it
  // keeps none; the headroom is capped; a derived limit takes none.
  FixedCost cost;
  StepPacer pacer(cost, 20.0, 512, 16);
  const StepShape so_far = decode_step(2, 100);
  auto most = [&](double budget) {  // the most tokens whose prediction is within budget
    int64_t n = 0;
    while (cost.predict_seconds(so_far.plus(0, n + 1, false)) <= budget) ++n;
    return n;
  };
  CHECK_EQ(pacer.headroom(), 1.0);
  CHECK_EQ(pacer.fit(so_far, 3, 512, 0.020, false), 29);  // 29 fit: from 3 to the block at 32
  pacer.observe(0.010, 0.0105);
  for (int i = 0; i < 14; ++i) pacer.observe(0.010, i == 3 ? 0.012 : 0.011);
  CHECK_NEAR(pacer.headroom(), 1.2, 1e-9);  // 15 seen: the largest, from the first
  for (int i = 0; i < 200; ++i) pacer.observe(0.010, i == 150 ? 0.030 : 0.011);
  CHECK_NEAR(pacer.headroom(), 1.1, 1e-9);
  CHECK_EQ(most(0.020 / 1.1), 25);
  CHECK_EQ(pacer.fit(so_far, 3, 512, 0.020, false), 13);  // 25 from 3 end at 28: cut at 16 (29 at 32)
  StepPacer tile(cost, 20.0, 512, 16, {0, 0}, 128, false);
  for (int i = 0; i < 128; ++i) tile.observe(0.010, 0.011);
  CHECK_EQ(tile.fit(so_far, 0, 512, 0.020, false), 25);
  for (int i = 0; i < 128; ++i) tile.observe(0.010, 0.009);
  CHECK_EQ(tile.headroom(), 1.0);
  CHECK_EQ(tile.fit(so_far, 0, 512, 0.020, false), 29);
  for (int i = 0; i < 128; ++i) tile.observe(0.010, 0.050);
  CHECK_EQ(tile.headroom(), StepPacer::kMaxHeadroom);
  StepPacer derived(cost, 0.0, 512, 16, {0, 0}, 128, false);
  for (int i = 0; i < 128; ++i) derived.observe(0.010, 0.012);
  const double limit = derived.limit_seconds(so_far, 0);
  CHECK_EQ(derived.fit(so_far, 0, 512, limit, false), most(limit));
}

TEST(derived_limit_keeps_the_prefill_at_80_percent_of_its_full_chunk_rate) {
  FixedCost cost;
  StepPacer pacer(cost, 0.0, 512, 16);
  for (int64_t rows : {1, 4, 8}) {
    for (int64_t depth : {0, 4096, 30000}) {
      const StepShape fixed = decode_step(rows, 200);
      const double limit = pacer.limit_seconds(fixed, depth);
      const int64_t p = pacer.fit(fixed, depth, 512, limit, false);
      const double alone_rate = 512.0 / cost.predict_seconds(StepShape{}.plus(depth, 512, false));
      auto rate = [&](int64_t n) { return static_cast<double>(n) / cost.predict_seconds(fixed.plus(depth, n, false)); };
      // The least whole blocks that keep 80 % of the rate alone (the per-step prefill cost included).
      CHECK_EQ((depth + p) % 16, 0);
      CHECK(rate(p) >= 0.8 * alone_rate);
      CHECK(rate(p - 16) < 0.8 * alone_rate);
      CHECK(limit > cost.predict_seconds(fixed));
    }
  }
}

namespace {
// Mixed steps 1.5x slower than the linear form says: no slice keeps 80 % of the full-chunk rate.
struct SlowMixedCost : FixedCost {
  double predict_seconds(const StepShape& s) const override {
    return dev.time(s) * (s.decode_rows > 0 && s.prefill_tokens > 0 ? 1.5 : 1.0);
  }
};
}  // namespace

TEST(derived_limit_out_of_reach_falls_back_to_the_slice_taking_80_percent_of_the_step) {
  SlowMixedCost cost;
  StepPacer pacer(cost, 0.0, 512, 16);
  const StepShape fixed = decode_step(2, 200);
  const double limit = pacer.limit_seconds(fixed, 1024);
  const int64_t p = pacer.fit(fixed, 1024, 512, limit, false);
  auto share = [&](int64_t n) { return 1.0 - cost.predict_seconds(fixed) / cost.predict_seconds(fixed.plus(1024, n, false)); };
  CHECK(p < 512);  // paced, not full chunks
  CHECK(share(p) >= 0.8);
  CHECK(share(p - 16) < 0.8);
}

TEST(derived_limit_of_a_step_without_decode_rows_leaves_the_long_prefill_one_block) {
  FixedCost cost;
  StepPacer pacer(cost, 0.0, 512, 16);
  const StepShape short_prompt = StepShape{}.plus(0, 20, false);  // a prompt that ends in the step
  const double limit = pacer.limit_seconds(short_prompt, 4096);
  CHECK_NEAR(limit, cost.predict_seconds(short_prompt), 1e-12);
  CHECK_EQ(pacer.fit(short_prompt, 4096, 512, limit, true), 16);
  CHECK_EQ(pacer.fit(short_prompt, 4100, 512, limit, true), 12);
}

TEST(one_prefill_size_counts_per_token_so_pacing_can_learn_the_slices) {
  // A long prompt in full chunks with decode steps beside it (an H100's 27B numbers: 10 ms a decode
  // row, ~0.11 ms a prefill token, no cost for holding prefill at all): the per-step and per-token
  // costs are the same column. The model must call a small slice what it costs (an unbiased fit
  // split it 25 ms a step + 0.05 a token: a 128-token slice 1.5x its time), so the pacer cuts one;
  // slices of other sizes then recover the device.
  Device dev{0.0, 0.010, 0.0, 0.11e-3, 5.6e-9};
  StepCostModel m;
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(1.0, 0.03);
  for (int i = 0; i < 64; ++i) {
    m.observe(mixed_step(0, 512 * i, 512), dev.time(mixed_step(0, 512 * i, 512)) * noise(rng));
    if (i % 8 == 0) m.observe(decode_step(1, 64), dev.time(decode_step(1, 64)) * noise(rng));
  }
  CHECK(m.ready());
  const StepShape slice = mixed_step(1, 16384, 128), chunk = mixed_step(1, 16384, 512);
  CHECK(near(m.predict_seconds(slice), dev.time(slice), 0.1));
  std::uniform_int_distribution<int64_t> tokens(16, 512);
  for (int i = 0; i < 60; ++i) {
    const StepShape s = mixed_step(1, 16384 + 256 * i, tokens(rng));
    m.observe(s, dev.time(s));
  }
  CHECK(near(m.predict_seconds(slice), dev.time(slice), 0.05));
  CHECK(near(m.predict_seconds(chunk), dev.time(chunk), 0.05));
}
