// CUDA linear (GEMV for n <= 8, tensor-core GEMM above) and embedding against the CPU twins:
// every weight dtype (F32, F16, BF16, FP8 e4m3 with 128x128 (and 256x256) block scales, I8 with
// row scales, NVFP4 with group + global scales), token counts around the GEMV/GEMM switch and the
// tile edges (64- and 128-token GEMM tiles), shapes that take the vector and the scalar paths,
// the row tilings of the quantized GEMV (T = 1, 2, 4), and the 27B shapes for decode (the fused
// projections too). Every quantized GEMV case runs with the default tuning, with x split in
// registers, with every tuning candidate on (cuda::GemvTuning) and without programmatic dependent
// launch, against one CPU reference.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "test_cuda_util.h"
#include "test_cuda_weights.h"

using namespace pe;
using pe_test::DevBuf;
using pe_test::DevWeight;
using pe_test::HostWeight;
using pe_test::make_weight;

namespace {

const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};
const DType kTableDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3};

// tile > 0: the device weight in the GEMV tile layout of that many rows (cuda::tile_weight), its
// padding rows poisoned (NaN for FP8: they are computed and must never reach out).
void check_linear(DType t, int64_t n, int64_t rows, int64_t cols, uint64_t seed, int64_t block = 128, int tile = 0) {
  pe_test::Rng rng(seed);
  const HostWeight hw = make_weight(t, rows, cols, seed + 1, block);
  const pe_test::DevTiledWeight dw(hw, tile);
  const std::vector<float> x = rng.normals(n * cols);
  std::vector<float> ref(n * rows);
  cpu::linear(x.data(), n, hw.view, ref.data());
  DevBuf<float> dx(x), dout(n * rows);
  // GEMM rounds x and W to fp16 (2^-11 relative each).
  const double tol = n <= 8 ? 1e-5 : 3e-3;
  // Quantized GEMV: x in registers, the default tuning, and every candidate of the tuning at once
  // (x staged up to 128 KB, 3 blocks per SM, 16 rows per warp).
  const bool q_gemv = n <= 8 && (t == DType::FP8_E4M3 || t == DType::I8 || t == DType::NVFP4);
  // The default launches as a programmatic dependent where the sm_90 code runs; "no pdl" does not.
  const cuda::GemvTuning dflt;
  cuda::GemvTuning regx, cand, nopdl, nosk, skall, roll, rollx, bal, fill8;
  regx.staged_x_max_bytes = 0;
  bal.stream_k_balance_pct = 50;  // stream-K over several waves only where the last is <= half full
  roll.roll = 2;  // tiled weights, every dtype: the next step's loads issued through the math
  roll.stream_k_spin = false;  // split row blocks summed by the last block to finish (a counter)
  roll.preload = 1;
  roll.x_early = 0;  // one x chunk a thread in flight while staging
  skall.stream_k_min_steps = 1;  // stream-K wherever the row blocks leave slots empty
  fill8.stream_k_min_steps = 1;  // the same, block shares on multiples of the 8 warps' steps
  fill8.stream_k_quantum = 8;
  rollx = skall;
  rollx.roll = 0;  // no dtype rolled
  rollx.staged_x_max_bytes = 0;
  cand.staged_x_max_bytes = 128 * 1024;
  cand.fp8_cvt = true;
  cand.min_blocks = 3;
  cand.rows_per_warp = 2;
  cand.pdl_prefetch_steps = 8;
  nosk.preload = 0;  // the first step only prefetched to L2 before pdl_wait
  nopdl.pdl = false;
  nosk.stream_k = false;       // one whole row block per block everywhere
  const struct { const cuda::GemvTuning* tuning; const char* name; } paths[] = {
      {&dflt, ""}, {&regx, " [x in registers]"}, {&cand, " [candidates]"}, {&nopdl, " [no pdl]"},
      {&nosk, " [no stream-k, no preload]"}, {&skall, " [stream-k from 1 step]"}, {&roll, " [roll]"},
      {&rollx, " [no roll, x in registers, stream-k from 1 step]"}, {&bal, " [stream-k balance at 50 %]"},
      {&fill8, " [stream-k from 1 step, 8-step quanta]"}};
  // (The default: preload 2, split rows summed by their first block from marked words, stream-k
  // balance wherever the last wave is part full; roll: preload 1, the counter's sum by the last
  // block, one x chunk a thread in flight while staging.)
  for (const auto& path : paths) {
    if (!q_gemv && path.tuning != &dflt) break;
    cuda::linear_gemv_set_tuning(*path.tuning);
    dout.poison();
    cuda::linear(dx.p, n, dw.view, dout.p, nullptr);
    cuda::linear_gemv_set_tuning(dflt);
    EXPECT_CLOSE("linear", cfgs("%s n=%lld %lldx%lld b%lld%s%s", dtype_name(t), (long long)n, (long long)rows,
                                (long long)cols, (long long)block, tile ? cfgs(" tile %d", tile).c_str() : "", path.name),
                 dout.download(), ref, tol);
  }
}

}  // namespace

// Columns a format cannot take (NVFP4 needs cols % 16 == 0) are rounded up to the next 16.
int64_t fit_cols(DType t, int64_t cols) { return t == DType::NVFP4 ? (cols + 15) / 16 * 16 : cols; }

TEST(cuda_linear_gemv_all_dtypes) {
  // 131 x 256, 96 x 128: the vector paths (quantized: 16-byte chunks, tails of the 512/1024
  // column steps); 67 x 200 (FP8/I8 cols % 16 = 8), 33 x 111 and NVFP4 x 208 (cols % 32 = 16):
  // the scalar path; 300 x 4096: one step per warp.
  for (DType t : kDtypes)
    for (int64_t n : {1, 2, 3, 5, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 256}, {67, 200}, {33, 111}, {300, 4096}})
        check_linear(t, n, rc.first, fit_cols(t, rc.second), 100 + n);
}

TEST(cuda_linear_gemv_quantized_tilings) {
  // Rows per warp 8 (< 2048 rows), 16 (< 4224) and 32, each with a partial last row group and
  // columns that leave the last step partly empty; FP8 with 256-wide blocks too.
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 2, 4, 5, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{1, 32}, {48, 5120}, {3001, 160}, {4301, 96}, {100, 1120}, {203, 2080}})
        check_linear(t, n, rc.first, rc.second, 300 + n);
  for (int64_t n : {1, 4})
    for (auto rc : {std::pair<int64_t, int64_t>{300, 640}, {2500, 384}, {4500, 256}})
      check_linear(DType::FP8_E4M3, n, rc.first, rc.second, 400 + n, 256);
  // 16-bit weights: few rows split the columns over up to 8 warps.
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t n : {1, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{48, 5120}, {1024, 640}, {5, 4096}})
        check_linear(t, n, rc.first, rc.second, 500 + n);
}

TEST(cuda_linear_gemv_staged_x_edges) {
  // x staged in shared memory (up to 32 KB, else the register path): 1 x 6144 columns (the
  // largest staged 27B shape), 1 x 17408 and 4 x 5120 (over the limit), a partial last step (208,
  // 1040, 5136 columns), a single chunk (16), every token count.
  for (DType t : {DType::FP8_E4M3, DType::I8})
    for (int64_t n : {1, 2, 3, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{1064, 1040}, {5123, 208}, {40, 5136}, {7, 16}})
        check_linear(t, n, rc.first, rc.second, 800 + n);
  for (int64_t n : {1, 4}) check_linear(DType::FP8_E4M3, n, 300, 17408, 810 + n);
  check_linear(DType::FP8_E4M3, 1, 5123, 6144, 812);
  for (int64_t n : {1, 4}) check_linear(DType::FP8_E4M3, n, 4500, 5120, 815 + n);
  // More row blocks than a wave holds (H200: 282 for 264 slots; 18 in the last wave, 7 %): stream-k
  // balance splits them.
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8}) check_linear(t, n, 9000, n == 3 ? 2080 : 2048, 840 + n, 128, n == 3 ? 0 : 32);
  for (int64_t n : {1, 8}) check_linear(DType::FP8_E4M3, n, 5123, 5136, 820 + n, 256);
  for (int64_t n : {1, 3}) check_linear(DType::NVFP4, n, 1064, 5120, 830 + n);
  // Long rows in the other quantized formats (x in registers).
  for (DType t : {DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8}) check_linear(t, n, 600, 17408, 840 + n);
}

TEST(cuda_linear_gemm_all_dtypes) {
  const bool small = small_only();
  for (DType t : kDtypes)
    for (int64_t n : {9, 17, 63, 65, 1000}) {
      if (small && n > 65) continue;
      for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 264}, {260, 200}, {33, 111}})
        check_linear(t, n, rc.first, fit_cols(t, rc.second), 200 + n);
    }
}

TEST(cuda_linear_gemm_tiles) {
  // 64-token tiles below 128 tokens, 128-token tiles from there (partial last tiles on both), the
  // grouped tile order with several groups (many token tiles over few weight tiles), FP8 with
  // 256-wide blocks.
  const bool small = small_only();
  for (DType t : {DType::FP8_E4M3, DType::BF16, DType::I8, DType::NVFP4})
    for (int64_t n : {127, 128, 129, 300})
      check_linear(t, n, 260, 256, 600 + n);
  if (!small) check_linear(DType::FP8_E4M3, 2100, 136, 2048, 700);
  for (int64_t n : {100, 200}) check_linear(DType::FP8_E4M3, n, 300, 640, 710 + n, 256);
}

TEST(cuda_linear_tiled_weights) {
  // The GEMV tile layout read by every linear path: the quantized GEMV at T = tile / 8 (whatever
  // the height), the GEMM (n > 8) and the scalar path (x not 16-byte aligned: below). Rows with a
  // partial last row block (300), columns of one and of several tiles per row block.
  const bool small = small_only();
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int tile : {8, 16, 32})
      for (int64_t n : {1, 3, 8, 17, 65})
        for (auto rc : {std::pair<int64_t, int64_t>{300, 1024}, {64, 2048}, {4500, 1024}}) {
          if (small && rc.first > 1000 && n > 8) continue;
          check_linear(t, n, rc.first, rc.second, 1000 + n + tile, 128, tile);
        }
  check_linear(DType::FP8_E4M3, 2, 300, 1024, 1100, 256, 32);  // 256-wide scale blocks
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4}) {  // x off 16-byte alignment: the scalar path
    const int64_t n = 3, rows = 300, cols = 1024;
    pe_test::Rng rng(1110);
    const HostWeight hw = make_weight(t, rows, cols, 1111);
    const pe_test::DevTiledWeight dw(hw, 16);
    const std::vector<float> x = rng.normals(n * cols + 1);
    std::vector<float> ref(n * rows);
    cpu::linear(x.data() + 1, n, hw.view, ref.data());
    DevBuf<float> dx(x), dout(n * rows);
    cuda::linear(dx.p + 1, n, dw.view, dout.p, nullptr);
    EXPECT_CLOSE("linear", cfgs("%s n=3 300x1024 tile 16 [x unaligned]", dtype_name(t)), dout.download(), ref, 1e-5);
  }
  // Tiling refuses what it cannot lay out: 16-bit weights, row bytes not a multiple of 4096 / R.
  const HostWeight h16 = make_weight(DType::BF16, 64, 1024, 3), h8 = make_weight(DType::FP8_E4M3, 64, 1040, 4);
  const DevWeight d16(h16), d8(h8);
  DevBuf<uint8_t> dst(1 << 17);
  int refused = 0;
  for (const WeightView* v : {&d16.view, &d8.view}) {
    try {
      cuda::tile_weight(*v, dst.p, 8, nullptr);
    } catch (const std::exception&) {
      ++refused;
    }
  }
  CHECK(refused == 2);
  CHECK(cuda::gemv_tile_rows(d16.view) == 0 && cuda::gemv_tile_rows(d8.view) == 0);
  if (small) return;
  // The 27B layer shapes as the model tiles them (gemv_tile_rows: 32 rows from 4224 rows up).
  for (int64_t n : {1, 8, 17}) {
    check_linear(DType::FP8_E4M3, n, 16560, 5120, 1200 + n, 128, 32);
    check_linear(DType::FP8_E4M3, n, 5120, 17408, 1210 + n, 128, 32);
    check_linear(DType::NVFP4, n, 5120, 6144, 1220 + n, 128, 32);
  }
}

namespace {

// The gate | up GEMV with swiglu in its epilogue (cuda::linear_swiglu): gate rows [0, inter), up
// rows [up0, up0 + inter) of one weight (rows between are padding, as join_pad_rows leaves them).
// Against the CPU (linear, then silu(g) * u) within the GEMV's tolerance, and bit for bit against
// the two-kernel path where its GEMV takes the same rows per warp (cuda::linear into [n, rows], then cuda::swiglu on the gate | up columns), for
// the default tuning and the others of check_linear that change the kernel.
void check_swiglu(DType t, int64_t n, int64_t inter, int64_t up0, int64_t cols, uint64_t seed, int tile = 0) {
  pe_test::Rng rng(seed);
  const int64_t rows = up0 + inter;
  const HostWeight hw = make_weight(t, rows, cols, seed + 1);
  const pe_test::DevTiledWeight dw(hw, tile);
  const std::vector<float> x = rng.normals(n * cols);
  std::vector<float> lin(n * rows), ref(n * inter);
  cpu::linear(x.data(), n, hw.view, lin.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inter; ++j) {
      const float g = lin[i * rows + j];
      ref[i * inter + j] = g / (1.0f + std::exp(-g)) * lin[i * rows + up0 + j];
    }
  DevBuf<float> dx(x), dlin(n * rows), dgu(n * 2 * inter), dtwo(n * inter), dout(n * inter);
  const std::string name = cfgs("%s n=%lld inter %lld up0 %lld cols %lld%s", dtype_name(t), (long long)n,
                                (long long)inter, (long long)up0, (long long)cols, tile ? cfgs(" tile %d", tile).c_str() : "");
  CHECK(cuda::linear_swiglu_supported(dx.p, n, dw.view, up0, inter));
  const cuda::GemvTuning dflt;
  cuda::GemvTuning nobal, regx, cand, roll, bal;
  // Bit for bit against linear + swiglu where neither splits a row block over blocks (stream-k
  // balance: the default wherever the last wave is part full, and bal where it is at most half
  // full, split the swiglu's row blocks and linear's differently): nobal (the default without
  // it), regx, cand and roll leave it off.
  nobal.stream_k_balance_pct = regx.stream_k_balance_pct = cand.stream_k_balance_pct = roll.stream_k_balance_pct = 0;
  regx.staged_x_max_bytes = 0;
  cand.staged_x_max_bytes = 128 * 1024;
  cand.min_blocks = 3;
  regx.preload = 0;  // the first step only prefetched to L2 before pdl_wait
  roll.roll = 2;
  roll.stream_k_spin = false;  // split rows summed by the last block (a counter), preload 1
  roll.preload = 1;
  bal.stream_k_balance_pct = 50;
  const cuda::GemvTuning* tunings[] = {&dflt, &nobal, &regx, &cand, &roll, &bal};
  for (const cuda::GemvTuning* tuning : tunings) {
    cuda::linear_gemv_set_tuning(*tuning);
    dout.poison();
    cuda::linear_swiglu(dx.p, n, dw.view, up0, inter, dout.p, nullptr);
    cuda::linear(dx.p, n, dw.view, dlin.p, nullptr);
    cuda::linear_gemv_set_tuning(dflt);
    const std::vector<float> l = dlin.download();
    std::vector<float> gu(n * 2 * inter);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inter; ++j) {
        gu[i * 2 * inter + j] = l[i * rows + j];
        gu[i * 2 * inter + inter + j] = l[i * rows + up0 + j];
      }
    dgu.upload(gu);
    cuda::swiglu(dgu.p, n, inter, dtwo.p, nullptr);
    const std::vector<float> fused = dout.download(), two = dtwo.download();
    const std::string cfg = name + (tuning == &nobal  ? " [no stream-k balance]"
                                    : tuning == &regx ? " [x in registers]"
                                    : tuning == &cand ? " [candidates]"
                                    : tuning == &bal  ? " [stream-k balance at 50 %]"
                                                      : "");
    EXPECT_CLOSE("linear_swiglu", cfg, fused, ref, 1e-5);
    // The same bits where both take the same rows per warp (below 2048 rows the plain GEMV takes
    // 8) and sum each row block in one block.
    if (tuning->stream_k_balance_pct == 0 && (tile || rows >= 2048))
      CHECK(std::memcmp(fused.data(), two.data(), fused.size() * sizeof(float)) == 0);
    else EXPECT_CLOSE("linear_swiglu", cfg + " [against linear + swiglu]", fused, two, 1e-5);
  }
}

}  // namespace

TEST(cuda_linear_swiglu) {
  // Row-major at 16 (< 2048 rows, raised from 8) and 32 rows per warp, partial last row blocks,
  // padding rows between gate and up (FP8: up0 on a block row), up0 == inter; tiled at 16 and
  // 32 rows; x staged and in registers (check_swiglu's tunings).
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 2, 3, 5, 8}) {
      check_swiglu(t, n, 1000, 1024, 256, 1400 + n);
      check_swiglu(t, n, 2112, 2176, 512, 1410 + n);
      check_swiglu(t, n, 2048, 2048, 1024, 1420 + n, 32);
      check_swiglu(t, n, 2200, 2304, 512, 1430 + n, 32);
      check_swiglu(t, n, 1000, 1024, 512, 1440 + n, 16);
    }
  // More row blocks than a wave holds (H200: 275 for 264 slots): stream-k balance splits them.
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8}) check_swiglu(t, n, 4400, 4480, 2048, 1460 + n, 32);
  // What it does not take: 16-bit weights, 9 tokens, up rows off the FP8 block or a tile's row
  // block, tiles of 8 rows.
  const HostWeight h16 = make_weight(DType::BF16, 2048, 256, 5), h8 = make_weight(DType::FP8_E4M3, 2048, 512, 6);
  const DevWeight d16(h16), d8(h8);
  DevBuf<float> dx(9 * 512), dout(9 * 2048);
  CHECK(!cuda::linear_swiglu_supported(dx.p, 1, d16.view, 1024, 1024));
  CHECK(!cuda::linear_swiglu_supported(dx.p, 9, d8.view, 1024, 1024));
  CHECK(!cuda::linear_swiglu_supported(dx.p, 1, d8.view, 1000, 1000));
  CHECK(!cuda::linear_swiglu_supported(dx.p, 1, d8.view, 1024, 1025));
  DevBuf<uint8_t> tiled(cuda::tiled_weight_bytes(d8.view, 8));
  const WeightView t8 = cuda::tile_weight(d8.view, tiled.p, 8, nullptr);
  CHECK(!cuda::linear_swiglu_supported(dx.p, 1, t8, 1024, 1024));
  bool threw = false;
  try {
    cuda::linear_swiglu(dx.p, 9, d8.view, 1024, 1024, dout.p, nullptr);
  } catch (const std::exception& e) {
    threw = std::strstr(e.what(), "linear_swiglu") != nullptr;
  }
  CHECK(threw);
  if (small_only()) return;
  for (int64_t n : {1, 8}) check_swiglu(DType::FP8_E4M3, n, 17408, 17408, 5120, 1450 + n, 32);  // the 27B mlp
}

TEST(cuda_linear_27b_shapes) {
  if (small_only()) return;
  // Decode of the 27B layer shapes (FP8 checkpoint weights; bf16 lm_head slice).
  check_linear(DType::FP8_E4M3, 1, 5120, 5120, 1);
  check_linear(DType::FP8_E4M3, 8, 1024, 17408, 2);
  check_linear(DType::FP8_E4M3, 3, 2 * 17408 / 8, 5120, 3);
  check_linear(DType::BF16, 1, 4096, 5120, 4);
  check_linear(DType::FP8_E4M3, 65, 512, 5120, 5);
  check_linear(DType::I8, 1, 2048, 5120, 6);
  check_linear(DType::NVFP4, 2, 2048, 17408, 7);
  check_linear(DType::NVFP4, 8, 10240, 5120, 8);
  // The fused decode projections (GDN in_proj qkv|z|a|b, attention q|k|v, out_proj, down).
  for (int64_t n : {1, 3, 8}) {
    check_linear(DType::FP8_E4M3, n, 16480, 5120, 10 + n);
    check_linear(DType::FP8_E4M3, n, 14336, 5120, 20 + n);
    check_linear(DType::FP8_E4M3, n, 48, 5120, 30 + n);
  }
  for (int64_t n : {1, 8}) {
    check_linear(DType::FP8_E4M3, n, 5120, 6144, 40 + n);
    check_linear(DType::FP8_E4M3, n, 5120, 17408, 50 + n);
    check_linear(DType::I8, n, 16480, 5120, 60 + n);
    check_linear(DType::NVFP4, n, 16480, 5120, 70 + n);
  }
  check_linear(DType::FP8_E4M3, 2, 34816, 5120, 80);
}

TEST(cuda_embedding_all_dtypes) {
  pe_test::Rng rng(7);
  for (DType t : kTableDtypes)
    for (int64_t H : {1, 64, 111}) {
      const int64_t V = 300, n = 17;
      const HostWeight hw = make_weight(t, V, H, 9);
      const DevWeight dw(hw);
      std::vector<int32_t> ids(n);
      for (auto& id : ids) id = static_cast<int32_t>(rng.below(V));
      std::vector<float> ref(n * H);
      cpu::embedding(hw.view, ids.data(), n, ref.data());
      DevBuf<int32_t> dids(ids);
      DevBuf<float> dout(n * H);
      cuda::embedding(dw.view, dids.p, n, dout.p, nullptr);
      EXPECT_CLOSE("embedding", cfgs("%s H=%lld", dtype_name(t), (long long)H), dout.download(), ref, 1e-6);
    }
}
