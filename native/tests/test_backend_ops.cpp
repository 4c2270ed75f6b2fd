// Every op of the backend interface (model/backend.h) on every backend against the CPU reference,
// table-driven (as llama.cpp's test-backend-ops): each case runs one op at one size on the backend
// under test and compares its outputs with a reference composed of the plain CPU ops (kernels/ops.h)
// on the same inputs, within the case's bound: normalized L2 error ||out - ref|| / ||ref|| AND max
// |out - ref| / max |ref| (a single wrong element fails it), every output written (outputs start
// as NaN). The CPU backend runs its fused ops (compositions) against the plain reference; the CUDA
// backend runs its kernels. CUDA-only cases (kernel knobs, kernels outside the interface) follow
// the interface's cases (test_backend_ops_cuda.inc).
//
// Usage: test_backend_ops [--backend cpu|cuda] [op filter]. Without --backend: cpu, then cuda
// (SKIP where the build has no CUDA backend or no device is present). PE_TEST_SMALL=1: small sizes
// only (compute-sanitizer and sm_75 PTX JIT runs). Exit status 0 when every case passes.
#define PE_TEST_NO_MAIN
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "core/dtype.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/ops.h"
#include "kernels/sampling.h"
#include "model/backend.h"

using namespace pe;
using pe_test::Rng;

namespace {

// ---- Harness ----

struct Bound {
  double rel, abs;  // normalized L2 error; max abs error over max |ref|
};
constexpr Bound kExact{0.0, 0.0}, kF32{1e-5, 1e-4}, kGemm{3e-3, 3e-2}, kChunked{1e-4, 1e-3};

bool small_only() {
  const char* e = std::getenv("PE_TEST_SMALL");
  return e && *e && *e != '0';
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

struct Case {
  std::string op, sizes;
  bool cuda_only;
  std::function<void(Backend&)> run;
  bool large = false;  // not run on the CPU backend at small sizes (there the same code as smaller ones)
};
std::vector<Case>& table() {
  static std::vector<Case> t;
  return t;
}
Case& add(const std::string& op, const std::string& sizes, std::function<void(Backend&)> run, bool cuda_only = false) {
  table().push_back({op, sizes, cuda_only, std::move(run)});
  return table().back();
}

int g_failed_checks = 0;
std::string g_label;  // "op sizes" of the running case

void fail(const std::string& msg) {
  ++g_failed_checks;
  std::printf("  FAIL %s: %s\n", g_label.c_str(), msg.c_str());
}
void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// Compares out with ref within b; prints one line per output.
void expect_close(const char* what, const std::vector<float>& out, const std::vector<float>& ref, Bound b) {
  double num = 0, den = 0, mx = 0, ref_max = 0;
  bool unwritten = out.size() != ref.size();
  for (size_t i = 0; i < ref.size() && !unwritten; ++i) {
    if (std::isnan(out[i]) != std::isnan(ref[i])) unwritten = true;
    if (std::isnan(ref[i])) continue;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    mx = std::max(mx, std::fabs(d));
    ref_max = std::max(ref_max, std::fabs(static_cast<double>(ref[i])));
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num), abs = ref_max > 0 ? mx / ref_max : mx;
  const bool ok = !unwritten && rel <= b.rel && abs <= b.abs;
  std::printf("  %-58s %-14s rel %.2e  max_abs %.2e  %s\n", g_label.c_str(), what, rel, abs, ok ? "ok" : "FAIL");
  if (!ok) {
    ++g_failed_checks;
    if (unwritten) std::printf("    (outputs unwritten, NaN, or of another size)\n");
  }
}

// An array on a device, NaN-poisoned (0xff bytes) until written.
template <typename T>
struct Arr {
  Buffer buf;
  int64_t n;
  Arr(Device d, int64_t count) : buf(d, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)), n(count) {
    poison();
  }
  Arr(Device d, const std::vector<T>& h) : Arr(d, static_cast<int64_t>(h.size())) { up(h); }
  T* p() const { return buf.as<T>(); }
  void up(const std::vector<T>& h) { mem_upload(buf.device(), buf.data(), h.data(), h.size() * sizeof(T)); }
  void poison() {
    const std::vector<uint8_t> ff(buf.size(), 0xff);
    mem_upload(buf.device(), buf.data(), ff.data(), ff.size());
  }
  std::vector<T> down() const {
    std::vector<T> h(static_cast<size_t>(n));
    mem_download(buf.device(), h.data(), buf.data(), h.size() * sizeof(T));
    return h;
  }
};
using F = Arr<float>;
using I = Arr<int32_t>;

// A weight of dtype t with random values (normal * 0.5 before quantization): host bytes + scales.
struct HostWeight {
  WeightView view;
  std::vector<uint8_t> bytes, group_scale;
  std::vector<float> scales;
};
HostWeight make_weight(DType t, int64_t rows, int64_t cols, uint64_t seed, int64_t block = 128) {
  Rng rng(seed);
  HostWeight w;
  w.view.dtype = t;
  w.view.rows = rows;
  w.view.cols = cols;
  const bool coded = t == DType::I8 || t == DType::NVFP4;  // random codes, no source values
  const std::vector<float> src = coded ? std::vector<float>() : rng.normals(rows * cols, 0.5f);
  w.bytes.resize(dtype_bytes_for(t, rows * cols));
  if (t == DType::FP8_E4M3) {
    const int64_t rb = (rows + block - 1) / block, cb = (cols + block - 1) / block;
    w.scales = rng.uniforms(rb * cb, 0.001f, 0.02f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        w.bytes[i * cols + j] = f32_to_fp8e4m3(src[i * cols + j] / w.scales[(i / block) * cb + j / block]);
    w.view.block_scale = w.scales.data();
    w.view.block = block;
  } else if (t == DType::I8) {
    w.scales = rng.uniforms(rows, 0.001f, 0.02f);
    for (auto& b : w.bytes) b = static_cast<uint8_t>(rng.below(256));
    w.view.row_scale = w.scales.data();
  } else if (t == DType::NVFP4) {  // every code, group scales over e4m3's normal and subnormal range
    w.group_scale.resize(rows * cols / 16);
    for (auto& g : w.group_scale) g = static_cast<uint8_t>(rng.below(0x7f));
    for (auto& b : w.bytes) b = static_cast<uint8_t>(rng.below(256));
    w.view.group_scale = w.group_scale.data();
    w.view.global_scale = 0.0173f;
  } else if (t == DType::F32) {
    std::memcpy(w.bytes.data(), src.data(), src.size() * 4);
  } else {
    auto* d = reinterpret_cast<uint16_t*>(w.bytes.data());
    for (size_t i = 0; i < src.size(); ++i) d[i] = t == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  }
  w.view.data = w.bytes.data();
  return w;
}

const DType kWeightDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};
const DType kKvDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3, DType::I8, DType::NVFP4};
bool quantized(DType t) { return t == DType::FP8_E4M3 || t == DType::I8 || t == DType::NVFP4; }
int64_t fit_cols(DType t, int64_t cols) { return t == DType::NVFP4 ? (cols + 15) / 16 * 16 : cols; }
std::vector<float> rows_of(const std::vector<float>& v, int64_t n, int64_t stride, int64_t off, int64_t width) {
  std::vector<float> r(static_cast<size_t>(n * width));
  for (int64_t i = 0; i < n; ++i) std::copy_n(&v[i * stride + off], width, &r[i * width]);
  return r;
}
float silu_mul(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

// Rows r0 .. r0 + n of a host weight (r0 on an FP8 block row), in place.
WeightView sub_rows(const WeightView& w, int64_t r0, int64_t n) {
  WeightView v = w;
  v.rows = n;
  v.data = static_cast<const uint8_t*>(w.data) + dtype_bytes_for(w.dtype, r0 * w.cols);
  if (w.block_scale) v.block_scale = w.block_scale + r0 / w.block * ((w.cols + w.block - 1) / w.block);
  if (w.row_scale) v.row_scale = w.row_scale + r0;
  if (w.group_scale) v.group_scale = w.group_scale + r0 * w.cols / 16;
  return v;
}

// A projection of the given matrices as runs of one matrix each, or of one matrix holding all
// parts (part p from row part_col[p]).
Projection separate_runs(Backend& be, const std::vector<WeightView>& ws) {
  Projection p;
  for (const WeightView& w : ws) {
    p.part_run.push_back(static_cast<int32_t>(p.runs.size()));
    p.part_col.push_back(0);
    p.run_offset.push_back(p.width);
    p.runs.push_back(be.place_matrix(w, true));
    p.width += w.rows;
  }
  return p;
}
Projection joined_run(Backend& be, const WeightView& joined, const std::vector<int64_t>& part_col) {
  Projection p;
  p.runs.push_back(be.place_matrix(joined, true));
  p.run_offset = {0};
  p.part_col = part_col;
  p.part_run.assign(part_col.size(), 0);
  p.width = joined.rows;
  return p;
}

// ---- Norms and element-wise ops ----

void norm_cases() {
  for (int64_t dim : {16, 111, 256, 1000, 5120})
    for (int64_t rows : {1, 3, 17, 65, 1000})
      for (int offset = 0; offset < 2; ++offset)
        add("rms_norm", fmt("dim %lld rows %lld offset %d", (long long)dim, (long long)rows, offset), [=](Backend& be) {
          Rng rng(dim * 7 + rows + offset);
          const auto x = rng.normals(rows * dim, 3.0f), w = rng.normals(dim, 0.5f);
          std::vector<float> ref(x.size());
          cpu::rms_norm(x.data(), w.data(), rows, dim, 1e-6f, offset, ref.data());
          F dx(be.device(), x), dw(be.device(), w), out(be.device(), rows * dim);
          be.rms_norm(dx.p(), dw.p(), rows, dim, 1e-6f, offset, out.p());
          expect_close("out", out.down(), ref, kF32);
          be.rms_norm(dx.p(), dw.p(), rows, dim, 1e-6f, offset, dx.p());
          expect_close("in place", dx.down(), ref, kF32);
        });
  for (int64_t dim : {16, 111, 1000, 1024, 1025, 5120})
    for (int64_t rows : {1, 3, 17, 65})
      add("add_rms_norm", fmt("dim %lld rows %lld", (long long)dim, (long long)rows), [=](Backend& be) {
        Rng rng(dim + rows * 3);
        const auto x = rng.normals(rows * dim, 3.0f), r = rng.normals(rows * dim), w = rng.normals(dim, 0.5f);
        std::vector<float> ref_x = x, ref(x.size());
        cpu::add_rms_norm(ref_x.data(), r.data(), w.data(), rows, dim, 1e-6f, true, ref.data());
        F dx(be.device(), x), dr(be.device(), r), dw(be.device(), w), out(be.device(), rows * dim);
        be.add_rms_norm(dx.p(), dr.p(), dw.p(), rows, dim, 1e-6f, true, out.p());
        expect_close("x", dx.down(), ref_x, kExact);
        expect_close("out", out.down(), ref, kF32);
      });
  for (int64_t dim : {16, 24, 128, 2000})
    for (int64_t rows : {1, 3, 17, 63, 1000})
      add("rms_norm_gated", fmt("dim %lld rows %lld", (long long)dim, (long long)rows), [=](Backend& be) {
        Rng rng(dim * 5 + rows);
        const auto x = rng.normals(rows * dim, 2.0f), z = rng.normals(rows * dim, 2.0f), w = rng.normals(dim, 0.5f);
        std::vector<float> ref(x.size());
        cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, ref.data());
        F dx(be.device(), x), dz(be.device(), z), dw(be.device(), w), out(be.device(), rows * dim);
        be.rms_norm_gated(dx.p(), dz.p(), dw.p(), rows, dim, 1e-6f, out.p());
        expect_close("out", out.down(), ref, kF32);
      });
  // z in place in a projection's output: a token's heads contiguous, tokens `stride` floats apart.
  for (int64_t dim : {64, 128, 160})
    for (int64_t tokens : {1, 8, 33})
      add("rms_norm_gated", fmt("strided z dim %lld tokens %lld", (long long)dim, (long long)tokens), [=](Backend& be) {
        const int64_t heads = 3, stride = heads * dim + 40, rows = tokens * heads;
        Rng rng(dim * 7 + tokens);
        const auto x = rng.normals(rows * dim, 2.0f), zs = rng.normals(tokens * stride, 2.0f), w = rng.normals(dim, 0.5f);
        std::vector<float> z(rows * dim), ref(x.size());
        for (int64_t t = 0; t < tokens; ++t)
          std::copy(zs.begin() + t * stride, zs.begin() + t * stride + heads * dim, z.begin() + t * heads * dim);
        cpu::rms_norm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, ref.data());
        F dx(be.device(), x), dz(be.device(), zs), dw(be.device(), w);
        be.rms_norm_gated(dx.p(), dz.p(), dw.p(), rows, dim, 1e-6f, dx.p(), heads, stride);  // in place
        expect_close("out", dx.down(), ref, kF32);
      });
  struct L2 { int64_t heads, dim, extra; float scale; };
  for (const L2 c : {L2{2, 32, 64, 0.17f}, L2{16, 128, 4096, 0.088f}, L2{3, 24, 0, 1.0f}})
    for (int64_t n : {1, 3, 17, 63, 1000})
      add("l2_norm_heads", fmt("n %lld heads %lld dim %lld", (long long)n, (long long)c.heads, (long long)c.dim),
          [=](Backend& be) {
            Rng rng(n + c.dim);
            const int64_t stride = c.heads * c.dim + c.extra;
            const auto x = rng.normals(n * stride, 2.0f);
            std::vector<float> ref = x;
            for (int64_t t = 0; t < n; ++t) cpu::l2_norm(ref.data() + t * stride, c.heads, c.dim, 1e-6f, c.scale);
            F dx(be.device(), x);
            be.l2_norm_heads(dx.p(), n, stride, c.heads, c.dim, 1e-6f, c.scale);
            expect_close("x", dx.down(), ref, kF32);
          });
  for (int64_t I : {1, 111, 17408})
    for (int64_t n : {1, 3, 17, 65})
      add("swiglu", fmt("I %lld n %lld", (long long)I, (long long)n), [=](Backend& be) {
        Rng rng(I + n);
        const auto gu = rng.normals(n * 2 * I, 3.0f);
        std::vector<float> ref(n * I);
        cpu::swiglu(gu.data(), n, I, ref.data());
        F dgu(be.device(), gu), out(be.device(), n * I);
        be.swiglu(dgu.p(), n, I, out.p());
        expect_close("out", out.down(), ref, kF32);
      });
  for (int64_t n : {1, 3, 17})
    add("copy_rows", fmt("n %lld", (long long)n), [=](Backend& be) {
      Rng rng(n);
      const auto src = rng.normals(n * 70);
      F ds(be.device(), src), dst(be.device(), n * 50 + 3);
      be.copy_rows(dst.p(), 50, ds.p() + 5, 70, 48, n);
      std::vector<float> got = dst.down(), ref(got.size(), NAN);
      for (int64_t i = 0; i < n; ++i) std::copy_n(&src[i * 70 + 5], 48, &ref[i * 50]);
      expect_close("rows", got, ref, kExact);  // the gaps stay unwritten (NaN in both)
    });
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3})
    for (int64_t H : {1, 64, 111})
      for (int64_t n : {1, 3, 17})
        add("embedding", fmt("%s H %lld n %lld", dtype_name(t), (long long)H, (long long)n), [=](Backend& be) {
          Rng rng(H + n);
          const HostWeight hw = make_weight(t, 300, H, 9);
          const Matrix table = be.place_matrix(hw.view, false);
          std::vector<int32_t> ids(n);
          for (auto& id : ids) id = static_cast<int32_t>(rng.below(300));
          std::vector<float> ref(n * H);
          cpu::embedding(hw.view, ids.data(), n, ref.data());
          I dids(be.device(), ids);
          F out(be.device(), n * H);
          be.embedding(table.view, dids.p(), n, out.p());
          expect_close("out", out.down(), ref, kExact);
        });
}

// ---- Projections ----

Bound linear_bound(int64_t n) { return n <= 8 ? kF32 : kGemm; }

// scale_mul multiplies the FP8 block / I8 row scales (the values scale with them).
void check_linear(Backend& be, DType t, int64_t n, int64_t rows, int64_t cols, uint64_t seed, int64_t block = 128,
                  float scale_mul = 1.0f) {
  Rng rng(seed);
  HostWeight hw = make_weight(t, rows, cols, seed + 1, block);
  for (float& s : hw.scales) s *= scale_mul;
  const Matrix m = be.place_matrix(hw.view, true);
  const auto x = rng.normals(n * cols);
  std::vector<float> ref(n * rows);
  cpu::linear(x.data(), n, hw.view, ref.data());
  F dx(be.device(), x), out(be.device(), n * rows);
  be.linear(dx.p(), n, m.view, out.p(), {});
  expect_close("out", out.down(), ref, linear_bound(n));
}

void linear_cases() {
  auto lin = [](DType t, int64_t n, int64_t rows, int64_t cols, uint64_t seed, int64_t block = 128) {
    add("linear", fmt("%s n %lld %lldx%lld b%lld", dtype_name(t), (long long)n, (long long)rows, (long long)cols,
                      (long long)block),
        [=](Backend& be) { check_linear(be, t, n, rows, cols, seed, block); })
        .large = rows * cols > (4 << 20);
  };
  const bool small = small_only();
  // GEMV (n <= 8): the vector paths, the scalar path (cols % 16 = 8, 111), one step per warp.
  for (DType t : kWeightDtypes)
    for (int64_t n : {1, 2, 3, 5, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 256}, {67, 200}, {33, 111}, {300, 4096}})
        lin(t, n, rc.first, fit_cols(t, rc.second), 100 + n);
  // Quantized GEMV: 8 / 16 / 32 rows per warp with a partial last row group; x staged in shared
  // memory or in registers (long rows); more row blocks than a wave (stream-K); FP8 256-blocks.
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 2, 4, 5, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{1, 32}, {48, 5120}, {3001, 160}, {4301, 96}, {100, 1120}, {203, 2080},
                      {1064, 1040}, {40, 5136}, {7, 16}})
        if (t != DType::NVFP4 || rc.second % 32 == 0) lin(t, n, rc.first, rc.second, 300 + n);
  for (int64_t n : {1, 4}) {
    lin(DType::FP8_E4M3, n, 300, 640, 400 + n, 256);
    lin(DType::FP8_E4M3, n, 2500, 384, 410 + n, 256);
    lin(DType::FP8_E4M3, n, 300, 17408, 810 + n);
    lin(DType::I8, n, 600, 17408, 840 + n);
    lin(DType::NVFP4, n, 1064, 5120, 830 + n);
  }
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8}) lin(t, n, 9000, n == 3 ? 2080 : 2048, 840 + n);
  // 16-bit: few rows split the columns over warps; 9 .. 64 tokens in groups of 8 (small matrices).
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t n : {1, 8, 24, 64})
      for (auto rc : {std::pair<int64_t, int64_t>{48, 5120}, {1024, 640}, {5, 4096}})
        lin(t, n, rc.first, rc.second, 500 + n);
  // GEMM (n > 8, linear_gemm.cuh): 64 x 256 block tiles below 128 tokens, 128 x 256 from there, 64 x
  // 256 on the scalar path (cols % 8 != 0: 111) at any count; partial last token, weight-row (260:
  // 4 rows in the last 256) and k tiles; grouped tile order.
  for (DType t : kWeightDtypes)
    for (int64_t n : {9, 17, 63, 65, 130, 1000})
      if (!small || n <= 130)
        for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 264}, {260, 200}, {33, 111}})
          lin(t, n, rc.first, fit_cols(t, rc.second), 200 + n);
  // Both sides of the tile switch (127 / 128), every weight format.
  for (DType t : kWeightDtypes)
    for (int64_t n : {127, 128, 129, 300}) lin(t, n, 260, 256, 600 + n);
  // Odd rows: the epilogue's single stores (pair stores need even rows), both tiles.
  for (DType t : kWeightDtypes)
    for (int64_t n : {40, 150}) lin(t, n, 517, 512, 730 + n);
  for (int64_t n : {100, 200}) lin(DType::FP8_E4M3, n, 300, 640, 710 + n, 256);
  // Scales outside the fp16 product's range (FP8 block scale * 256 > 146, I8 row scale < 6.2e-5):
  // those weights converted through fp32, the others in fp16, both tiles.
  for (int64_t n : {40, 150}) {
    add("linear", fmt("fp8_e4m3 n %lld 300x640 b128, block scales x 50", (long long)n),
        [=](Backend& be) { check_linear(be, DType::FP8_E4M3, n, 300, 640, 760 + n, 128, 50.0f); });
    add("linear", fmt("i8 n %lld 300x640 b128, row scales x 0.01", (long long)n),
        [=](Backend& be) { check_linear(be, DType::I8, n, 300, 640, 770 + n, 128, 0.01f); });
  }
  if (small) return;
  lin(DType::FP8_E4M3, 2100, 136, 2048, 700);
  // Several tile groups (group_m = 16 MB of x rows / the tile's row bytes): 4 of one 128-token
  // tile, 2 of one 64-token tile.
  lin(DType::FP8_E4M3, 500, 40, 17408, 720);
  lin(DType::BF16, 100, 24, 34816, 721);
  // The 27B layer shapes (fused projections too; bf16 lm_head slice).
  for (int64_t n : {1, 3, 8, 17}) {
    lin(DType::FP8_E4M3, n, 16480, 5120, 10 + n);   // GDN in_proj qkv | z | a | b
    lin(DType::FP8_E4M3, n, 14336, 5120, 20 + n);   // attention q | k | v
    lin(DType::FP8_E4M3, n, 5120, 6144, 40 + n);    // out_proj
    lin(DType::FP8_E4M3, n, 5120, 17408, 50 + n);   // down
    lin(DType::NVFP4, n, 16480, 5120, 70 + n);
    lin(DType::I8, n, 16480, 5120, 60 + n);
  }
  lin(DType::FP8_E4M3, 2, 34816, 5120, 80);
  lin(DType::BF16, 1, 4096, 5120, 4);
  lin(DType::FP8_E4M3, 65, 512, 5120, 5);
}

// project_swiglu on gate | up: one run with the up rows at up0 (padding rows between, as the
// model's FP8 runs), or two runs. Reference: linear, then silu(gate) * up.
void check_swiglu(Backend& be, DType t, int64_t n, int64_t inter, int64_t up0, int64_t cols, bool joined, uint64_t seed) {
  Rng rng(seed);
  const int64_t rows = up0 + inter;
  const HostWeight hw = make_weight(t, rows, cols, seed + 1);
  const auto x = rng.normals(n * cols);
  std::vector<float> lin(n * rows), ref(n * inter);
  cpu::linear(x.data(), n, hw.view, lin.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inter; ++j) ref[i * inter + j] = silu_mul(lin[i * rows + j], lin[i * rows + up0 + j]);
  const WeightView gate = sub_rows(hw.view, 0, inter), up = sub_rows(hw.view, up0, inter);
  const Projection p = joined ? joined_run(be, hw.view, {0, up0}) : separate_runs(be, {gate, up});
  F dx(be.device(), x), act(be.device(), n * inter), scratch(be.device(), Backend::project_swiglu_scratch(n, p, inter));
  be.project_swiglu(dx.p(), n, p, inter, act.p(), {}, scratch.p());
  expect_close("act", act.down(), ref, linear_bound(n));
}

// x += in P^T; h = rms_norm(x) (offset), then the consumer (a projection, or gate | up with
// swiglu) on h: through project_add_norm's NormState, against CPU linear, add_rms_norm, linear.
struct SplitShape {
  int64_t H, K, N;  // residual width (producer rows), producer columns, consumer rows (or inter)
  bool swiglu;
};
// A config for Backend::reserve of a residual width H (the split norm's partial sums).
ModelConfig split_config(int64_t H) {
  ModelConfig c;
  c.hidden = H;
  c.vocab = c.gdn_v_heads = 1;
  return c;
}

void check_add_norm(Backend& be, DType t, int64_t n, const SplitShape& s, uint64_t seed) {
  Rng rng(seed);
  const float eps = 1e-6f;
  const HostWeight hp = make_weight(t, s.H, s.K, seed + 1);
  const int64_t q_rows = s.swiglu ? 2 * s.N : s.N;
  const HostWeight hq = make_weight(t, q_rows, s.H, seed + 2);
  const auto in = rng.normals(n * s.K), x0 = rng.normals(n * s.H, 4.0f), nw = rng.normals(s.H, 0.2f);
  std::vector<float> mix(n * s.H), x_ref = x0, h_ref(n * s.H), q_ref(n * q_rows), ref(n * s.N);
  cpu::linear(in.data(), n, hp.view, mix.data());
  cpu::add_rms_norm(x_ref.data(), mix.data(), nw.data(), n, s.H, eps, true, h_ref.data());
  cpu::linear(h_ref.data(), n, hq.view, q_ref.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s.N; ++j)
      ref[i * s.N + j] = s.swiglu ? silu_mul(q_ref[i * q_rows + j], q_ref[i * q_rows + s.N + j]) : q_ref[i * q_rows + j];
  const Projection producer = joined_run(be, hp.view, {0});
  const Projection consumer = joined_run(be, hq.view, s.swiglu ? std::vector<int64_t>{0, s.N} : std::vector<int64_t>{0});
  F din(be.device(), in), x(be.device(), x0), h(be.device(), n * s.H), mixd(be.device(), n * s.H), w(be.device(), nw),
      out(be.device(), n * s.N), scratch(be.device(), Backend::project_swiglu_scratch(n, consumer, s.N));
  be.reserve(split_config(s.H), n, 1, 1, 0);  // the split norm's partial sums
  const Residual r{x.p(), h.p(), mixd.p(), s.H, eps, true};
  const NormState st = be.project_add_norm(din.p(), n, producer, r, w.p(), &consumer);
  if (s.swiglu)
    be.project_swiglu(h.p(), n, consumer, s.N, out.p(), st, scratch.p());
  else
    be.project(h.p(), n, consumer, out.p(), st);
  expect_close("x", x.down(), x_ref, linear_bound(n));  // the producer GEMV's error on mix
  expect_close("consumer", out.down(), ref, linear_bound(n));
  if (!st.pending) expect_close("h", h.down(), h_ref, linear_bound(n));
  // Without a consumer the norm is materialized in h.
  F x2(be.device(), x0), h2(be.device(), n * s.H);
  const Residual r2{x2.p(), h2.p(), mixd.p(), s.H, eps, true};
  expect(!be.project_add_norm(din.p(), n, producer, r2, w.p(), nullptr).pending, "a norm without consumer pends");
  expect_close("h (no consumer)", h2.down(), h_ref, linear_bound(n));
}

void projection_cases() {
  const bool small = small_only();
  for (DType t : kWeightDtypes)
    for (int64_t n : {1, 2, 3, 5, 8, 9, 17})
      for (bool joined : {true, false}) {
        struct S { int64_t inter, up0, cols; };
        for (const S s : {S{1000, 1024, 256}, S{2112, 2176, 512}, S{2048, 2048, 1024}, S{2200, 2304, 512}})
          add("project_swiglu", fmt("%s n %lld inter %lld up0 %lld cols %lld %s", dtype_name(t), (long long)n,
                                    (long long)s.inter, (long long)s.up0, (long long)s.cols, joined ? "one run" : "two runs"),
              [=](Backend& be) { check_swiglu(be, t, n, s.inter, s.up0, s.cols, joined, 1400 + n + s.inter); });
      }
  for (DType t : {DType::FP8_E4M3, DType::I8, DType::NVFP4})
    for (int64_t n : {1, 3, 8})
      add("project_swiglu", fmt("%s n %lld inter 4400 up0 4480 cols 2048", dtype_name(t), (long long)n),
          [=](Backend& be) { check_swiglu(be, t, n, 4400, 4480, 2048, true, 1460 + n); })
          .large = true;
  if (!small)
    for (int64_t n : {1, 8})  // the 27B mlp
      add("project_swiglu", fmt("fp8 n %lld inter 17408 cols 5120", (long long)n),
          [=](Backend& be) { check_swiglu(be, DType::FP8_E4M3, n, 17408, 17408, 5120, true, 1450 + n); });
  const SplitShape shapes[] = {{1056, 512, 768, false},  {1024, 256, 1024, true}, {4352, 512, 4352, false},
                               {2048, 1024, 2048, true}, {4096, 768, 520, false}, {4240, 512, 776, false}};
  for (DType t : kWeightDtypes)
    for (int64_t n : {1, 3, 8, 9})
      for (const SplitShape& s : shapes)
        if ((t != DType::NVFP4 || s.H % 32 == 0) && (quantized(t) || n != 3))
          add("project_add_norm", fmt("%s n %lld H %lld K %lld %s %lld", dtype_name(t), (long long)n, (long long)s.H,
                                      (long long)s.K, s.swiglu ? "swiglu" : "N", (long long)s.N),
              [=](Backend& be) { check_add_norm(be, t, n, s, 1600 + s.H + n); })
              .large = s.H > 2048;
  if (!small)
    for (int64_t n : {1, 8}) {  // the 27B decode: out_proj into gate | up, down into the GDN in_proj
      add("project_add_norm", fmt("fp8 n %lld 27B out_proj -> gate|up", (long long)n),
          [=](Backend& be) { check_add_norm(be, DType::FP8_E4M3, n, {5120, 6144, 17408, true}, 1700 + n); });
      add("project_add_norm", fmt("fp8 n %lld 27B down -> in_proj", (long long)n),
          [=](Backend& be) { check_add_norm(be, DType::FP8_E4M3, n, {5120, 17408, 16480, false}, 1710 + n); });
    }
  // The embedding and the first input norm, into the first projection (split on CUDA for a
  // quantized one, 1..8 tokens).
  for (DType et : {DType::BF16, DType::F16})
    for (DType qt : {DType::FP8_E4M3, DType::BF16})
      for (int64_t n : {1, 3, 8, 17})
        add("embed_norm", fmt("%s table, %s consumer, n %lld", dtype_name(et), dtype_name(qt), (long long)n),
            [=](Backend& be) {
              const int64_t V = 300, H = 1296, N = 776;
              const HostWeight he = make_weight(et, V, H, 40 + n), hq = make_weight(qt, N, H, 50 + n);
              Rng rng(60 + n);
              std::vector<int32_t> ids(n);
              for (auto& id : ids) id = static_cast<int32_t>(rng.below(V));
              const auto nw = rng.normals(H, 0.2f);
              std::vector<float> x_ref(n * H), h_ref(n * H), ref(n * N);
              cpu::embedding(he.view, ids.data(), n, x_ref.data());
              cpu::rms_norm(x_ref.data(), nw.data(), n, H, 1e-6f, true, h_ref.data());
              cpu::linear(h_ref.data(), n, hq.view, ref.data());
              const Matrix table = be.place_matrix(he.view, false);
              const Projection consumer = joined_run(be, hq.view, {0});
              I dids(be.device(), ids);
              F x(be.device(), n * H), h(be.device(), n * H), mix(be.device(), n * H), w(be.device(), nw),
                  out(be.device(), n * N);
              be.reserve(split_config(H), n, 1, 1, 0);
              const NormState st =
                  be.embed_norm(table.view, dids.p(), n, {x.p(), h.p(), mix.p(), H, 1e-6f, true}, w.p(), &consumer);
              be.project(h.p(), n, consumer, out.p(), st);
              expect_close("x", x.down(), x_ref, kExact);
              expect_close("consumer", out.down(), ref, linear_bound(n));
            });
}

}  // namespace

namespace {
void dflash_cases();  // test_backend_ops_dflash.inc (it uses the mixers' helpers)
}  // namespace

#include "test_backend_ops_gdn.inc"
#include "test_backend_ops_mixers.inc"
#include "test_backend_ops_dflash.inc"
