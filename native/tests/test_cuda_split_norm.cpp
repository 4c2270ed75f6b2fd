// The split norm (cuda_ops.h SplitNorm): linear_add_norm (the producer GEMV adds its output to the
// residual and writes h and the partial sums of x^2) followed by linear / linear_swiglu with the
// norm (the consumer applies 1 / rms), against the CPU's linear, add_rms_norm, linear (swiglu) and
// against the CUDA ops it replaces (cuda::linear, cuda::add_rms_norm, cuda::linear): every
// quantized weight format, row-major and tiled, 1 / 3 / 8 tokens, row blocks cut by the last
// row, the default tuning, x in registers, stream-K from one step (the finisher's path on both
// sides) and no programmatic dependent launch. And the embedding as the first norm's producer.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "test_cuda_util.h"
#include "test_cuda_weights.h"

using namespace pe;
using pe_test::DevBuf;
using pe_test::DevWeight;
using pe_test::HostWeight;
using pe_test::make_weight;

namespace {

// A split norm over device rows x / h of `dim`, weight w, partials in `partial`.
cuda::SplitNorm split_norm(float* x, float* h, const float* w, float* partial, int64_t dim, float eps = 1e-6f) {
  cuda::SplitNorm sn;
  sn.x = x;
  sn.h = h;
  sn.w = w;
  sn.eps = eps;
  sn.dim = dim;
  sn.partial = partial;
  return sn;
}

struct Shape {
  int64_t H, K, N;  // residual width (producer rows), producer columns, consumer rows (or inter)
  int tile_p, tile_q;
  bool swiglu;
};

void check_split(DType t, int64_t n, const Shape& s, uint64_t seed) {
  pe_test::Rng rng(seed);
  const float eps = 1e-6f;
  const HostWeight hp = make_weight(t, s.H, s.K, seed + 1);
  const int64_t q_rows = s.swiglu ? 2 * s.N : s.N;  // swiglu: gate rows [0, N), up rows [N, 2N)
  const HostWeight hq = make_weight(t, q_rows, s.H, seed + 2);
  const pe_test::DevTiledWeight dp(hp, s.tile_p), dq(hq, s.tile_q);
  const std::vector<float> in = rng.normals(n * s.K), x0 = rng.normals(n * s.H, 4.0f);
  std::vector<float> nw = rng.normals(s.H, 0.2f);

  // CPU: mix = in P^T; x = x0 + mix; h = rms_norm(x) * (1 + w); out = h Q^T (then swiglu).
  std::vector<float> mix(n * s.H), x_ref = x0, h_ref(n * s.H), q_ref(n * q_rows), ref(n * s.N);
  cpu::linear(in.data(), n, hp.view, mix.data());
  cpu::add_rms_norm(x_ref.data(), mix.data(), nw.data(), n, s.H, eps, true, h_ref.data());
  cpu::linear(h_ref.data(), n, hq.view, q_ref.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s.N; ++j) {
      const float g = q_ref[i * q_rows + j];
      ref[i * s.N + j] = s.swiglu ? g / (1.0f + std::exp(-g)) * q_ref[i * q_rows + s.N + j] : g;
    }
  // The CUDA ops the split replaces: linear, add_rms_norm, linear (+ swiglu).
  DevBuf<float> din(in), dx2(x0), dmix(n * s.H), dh2(n * s.H), dq2(n * q_rows), dout2(n * s.N), dw(nw);
  cuda::linear(din.p, n, dp.view, dmix.p, nullptr);
  cuda::add_rms_norm(dx2.p, dmix.p, dw.p, n, s.H, eps, true, dh2.p, nullptr);
  if (s.swiglu) {
    cuda::linear_swiglu(dh2.p, n, dq.view, s.N, s.N, dout2.p, nullptr);
  } else {
    cuda::linear(dh2.p, n, dq.view, dout2.p, nullptr);
  }
  const std::vector<float> x_two = dx2.download(), out_two = dout2.download();

  const std::string name = cfgs("%s n=%lld H %lld K %lld %s %lld tiles %d/%d", dtype_name(t), (long long)n,
                                (long long)s.H, (long long)s.K, s.swiglu ? "swiglu" : "N", (long long)s.N, s.tile_p,
                                s.tile_q);
  CHECK(cuda::linear_split_norm_supported(din.p, n, dp.view) && cuda::linear_split_norm_supported(dh2.p, n, dq.view));
  const cuda::GemvTuning dflt;
  cuda::GemvTuning regx, skall, nopdl, roll, fill8;
  fill8.stream_k_min_steps = 1;  // stream-K wherever the row blocks leave slots empty, 8-step quanta
  fill8.stream_k_quantum = 8;
  regx.staged_x_max_bytes = 0;
  skall.stream_k_min_steps = 1;
  skall.preload = 0;  // the first step only prefetched to L2 before pdl_wait
  nopdl.pdl = false;
  skall.stream_k_spin = false;  // split rows summed by the last block to finish (a counter)
  skall.x_early = 0;  // the partials summed before x is staged, one x chunk a thread in flight
  roll = skall;
  roll.roll = 2;
  roll.preload = 2;
  roll.stream_k_spin = true;  // split rows summed by their first block, from marked words
  roll.x_early = 3;
  const struct { const cuda::GemvTuning* tuning; const char* name; } paths[] = {
      {&dflt, ""}, {&regx, " [x in registers]"}, {&skall, " [stream-k from 1 step, no preload, counter, no early loads]"},
      {&nopdl, " [no pdl]"}, {&roll, " [roll, stream-k from 1 step, marked parts]"},
      {&fill8, " [stream-k from 1 step, 8-step quanta]"}};
  for (const auto& path : paths) {
    cuda::linear_gemv_set_tuning(*path.tuning);
    DevBuf<float> dx(x0), dh(n * s.H), dpart(n * cuda::split_norm_partial_floats(s.H)), dout(n * s.N);
    cuda::SplitNorm sn = split_norm(dx.p, dh.p, dw.p, dpart.p, s.H, eps);
    cuda::linear_add_norm(din.p, n, dp.view, sn, nullptr);
    if (s.swiglu) cuda::linear_swiglu(dh.p, n, dq.view, s.N, s.N, dout.p, nullptr, &sn);
    else cuda::linear(dh.p, n, dq.view, dout.p, nullptr, &sn);
    // The stream-K tuning also reaches the two-kernel path's GEMVs: compare with those of the default.
    cuda::linear_gemv_set_tuning(dflt);
    const std::string cfg = name + path.name;
    const std::vector<float> x = dx.download(), h = dh.download(), part = dpart.download(), out = dout.download();
    // x: add_rms_norm's fp32 add of the same GEMV sums where the GEMV is the same kernel (other
    // tunings may sum in another order).
    if (path.tuning == &dflt || path.tuning == &nopdl) CHECK(std::memcmp(x.data(), x_two.data(), x.size() * sizeof(float)) == 0);
    EXPECT_CLOSE("split x", cfg, x, x_ref, 1e-5);  // the GEMV's tolerance on mix
    // h = x * (1 + w) exactly; the partials cover every row: their sum is sum(x^2).
    std::vector<float> h_exp(n * s.H), ss(n), ss_ref(n);
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0.0, acc_ref = 0.0;
      for (int64_t j = 0; j < s.H; ++j) {
        h_exp[i * s.H + j] = x[i * s.H + j] * (1.0f + nw[j]);
        acc_ref += static_cast<double>(x[i * s.H + j]) * x[i * s.H + j];
      }
      for (int p = 0; p < sn.parts; ++p) acc += part[i * sn.parts + p];
      ss[i] = static_cast<float>(acc);
      ss_ref[i] = static_cast<float>(acc_ref);
    }
    CHECK(std::memcmp(h.data(), h_exp.data(), h.size() * sizeof(float)) == 0);
    CHECK(sn.parts > 0 && sn.parts <= cuda::split_norm_partial_floats(s.H));
    EXPECT_CLOSE("split partials", cfg, ss, ss_ref, 1e-6);
    EXPECT_CLOSE("split norm", cfg, out, ref, 1e-5);
    EXPECT_CLOSE("split norm", cfg + " [against linear, add_rms_norm, linear]", out, out_two, 1e-5);
  }
}

}  // namespace

TEST(cuda_split_norm) {
  // Row-major (8 and 32 rows per warp by the height; 1000 rows: the last row block cut) and
  // tiled producers; plain and swiglu consumers.
  // 4240 rows (FP8 / I8 only: NVFP4 needs columns % 32) leave the last 32-row block cut.
  const Shape shapes[] = {
      {1056, 512, 768, 0, 0, false},   {1024, 256, 1024, 0, 0, true}, {4352, 512, 4352, 32, 32, false},
      {2048, 1024, 2048, 16, 32, true}, {4096, 768, 520, 32, 0, false}, {4240, 512, 776, 0, 0, false},
  };
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8})
      for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); ++i)
        if (t != DType::NVFP4 || shapes[i].H % 32 == 0) check_split(t, n, shapes[i], 1600 + 10 * i + n);
  // What it refuses: 16-bit weights, 9 tokens, a producer whose rows are not dim, a consumer
  // without the producer's partials.
  const HostWeight h16 = make_weight(DType::BF16, 1024, 256, 5), h8 = make_weight(DType::FP8_E4M3, 1024, 256, 6);
  const DevWeight d16(h16), d8(h8);
  DevBuf<float> dx(9 * 1024), dh(9 * 1024), dpart(9 * 128), dout(9 * 1024), dw(1024);
  CHECK(!cuda::linear_split_norm_supported(dx.p, 1, d16.view));
  CHECK(!cuda::linear_split_norm_supported(dx.p, 9, d8.view));
  cuda::SplitNorm sn = split_norm(dx.p, dh.p, dw.p, dpart.p, 1000);
  auto refused = [](auto&& f, const char* op) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::strstr(e.what(), op) != nullptr;
    }
    return false;
  };
  CHECK(refused([&] { cuda::linear_add_norm(dx.p, 1, d8.view, sn, nullptr); }, "linear_add_norm"));
  sn.dim = 1024;
  CHECK(refused([&] { cuda::linear_add_norm(dx.p, 9, d8.view, sn, nullptr); }, "linear_add_norm"));
  CHECK(refused([&] { cuda::linear(dx.p, 1, d8.view, dout.p, nullptr, &sn); }, "cuda::linear"));  // parts 0
  sn.parts = 128;
  CHECK(refused([&] { cuda::linear(dx.p, 1, d16.view, dout.p, nullptr, &sn); }, "cuda::linear"));
  if (small_only()) return;
  // The 27B decode: out_proj (6144 columns) into gate | up (swiglu), down (17408 columns, stream-K
  // by default) into the GDN in_proj qkv | z | a | b.
  for (int64_t n : {1, 8}) {
    check_split(DType::FP8_E4M3, n, {5120, 6144, 17408, 32, 32, true}, 1700 + n);
    check_split(DType::FP8_E4M3, n, {5120, 17408, 16480, 32, 32, false}, 1710 + n);
  }
}

TEST(cuda_embedding_split_norm) {
  // The embedding as the first input norm's producer (cuda::embedding_norm) into a quantized in
  // projection, against the CPU's embedding, rms_norm (offset weight) and linear; 1 / 3 / 8 tokens,
  // a width the blocks' spans do not divide.
  for (DType et : {DType::BF16, DType::F16})
    for (int64_t n : {1, 3, 8}) {
      const int64_t V = 300, H = 1296, N = 776;  // H: the GEMV takes columns % 16
      const HostWeight he = make_weight(et, V, H, 40 + n), hq = make_weight(DType::FP8_E4M3, N, H, 50 + n);
      const DevWeight de(he), dq(hq);
      pe_test::Rng rng(60 + n);
      std::vector<int32_t> ids(n);
      for (auto& id : ids) id = static_cast<int32_t>(rng.next() % V);
      const std::vector<float> nw = rng.normals(H, 0.2f);
      std::vector<float> x_ref(n * H), h_ref(n * H), ref(n * N);
      cpu::embedding(he.view, ids.data(), n, x_ref.data());
      cpu::rms_norm(x_ref.data(), nw.data(), n, H, 1e-6f, true, h_ref.data());
      cpu::linear(h_ref.data(), n, hq.view, ref.data());
      DevBuf<int32_t> dids(ids);
      DevBuf<float> dx(n * H), dh(n * H), dpart(n * cuda::split_norm_partial_floats(H)), dw(nw), dout(n * N);
      cuda::SplitNorm sn = split_norm(dx.p, dh.p, dw.p, dpart.p, H);
      cuda::embedding_norm(de.view, dids.p, n, sn, nullptr);
      cuda::linear(dh.p, n, dq.view, dout.p, nullptr, &sn);
      const std::vector<float> x = dx.download(), h = dh.download(), out = dout.download();
      std::vector<float> h_exp(n * H);
      for (int64_t i = 0; i < n * H; ++i) h_exp[i] = x[i] * (1.0f + nw[i % H]);
      const std::string cfg = cfgs("%s n=%lld", dtype_name(et), (long long)n);
      CHECK(std::memcmp(x.data(), x_ref.data(), x.size() * sizeof(float)) == 0);  // the rows, exactly
      CHECK(std::memcmp(h.data(), h_exp.data(), h.size() * sizeof(float)) == 0);
      CHECK(sn.parts > 1 && sn.parts <= cuda::split_norm_partial_floats(H));
      EXPECT_CLOSE("embedding split norm", cfg, out, ref, 1e-5);
    }
}
