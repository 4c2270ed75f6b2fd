// CUDA linear (GEMV for n <= 8, tensor-core GEMM above) and embedding against the CPU twins:
// every weight dtype (F32, F16, BF16, FP8 e4m3 with 128x128 block scales), token counts around
// the GEMV/GEMM switch and the tile edges, shapes that take the vector and the scalar paths,
// and the 27B shapes for decode.
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using pe_test::DevBuf;

namespace {

// A weight of dtype t with random values (normal * 0.5 before quantization), host bytes + scales.
struct HostWeight {
  WeightView view;  // host pointers
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

HostWeight make_weight(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  pe_test::Rng rng(seed);
  HostWeight w;
  w.view.dtype = t;
  w.view.rows = rows;
  w.view.cols = cols;
  const std::vector<float> src = rng.normals(rows * cols, 0.5f);
  w.bytes.resize(dtype_bytes_for(t, rows * cols));
  if (t == DType::FP8_E4M3) {
    const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    w.scales.resize(rb * cb);
    for (auto& s : w.scales) s = rng.uniform(0.001f, 0.02f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        w.bytes[i * cols + j] = f32_to_fp8e4m3(src[i * cols + j] / w.scales[(i / 128) * cb + j / 128]);
    w.view.block_scale = w.scales.data();
  } else if (t == DType::F32) {
    std::memcpy(w.bytes.data(), src.data(), src.size() * 4);
  } else {
    auto* d = reinterpret_cast<uint16_t*>(w.bytes.data());
    for (size_t i = 0; i < src.size(); ++i) d[i] = t == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  }
  w.view.data = w.bytes.data();
  return w;
}

// The same weight on the device.
struct DevWeight {
  DevBuf<uint8_t> bytes;
  DevBuf<float> scales;
  WeightView view;
  explicit DevWeight(const HostWeight& h) : bytes(h.bytes), scales(h.scales) {
    view = h.view;
    view.data = bytes.p;
    view.block_scale = h.scales.empty() ? nullptr : scales.p;
  }
};

const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3};

void check_linear(DType t, int64_t n, int64_t rows, int64_t cols, uint64_t seed) {
  pe_test::Rng rng(seed);
  const HostWeight hw = make_weight(t, rows, cols, seed + 1);
  const DevWeight dw(hw);
  const std::vector<float> x = rng.normals(n * cols);
  std::vector<float> ref(n * rows);
  cpu::linear(x.data(), n, hw.view, ref.data());
  DevBuf<float> dx(x), dout(n * rows);
  cuda::linear(dx.p, n, dw.view, dout.p, nullptr);
  // GEMM rounds x and W to fp16 (2^-11 relative each).
  const double tol = n <= 8 ? 1e-5 : 3e-3;
  EXPECT_CLOSE("linear", cfgs("%s n=%lld %lldx%lld", dtype_name(t), (long long)n, (long long)rows,
                              (long long)cols),
               dout.download(), ref, tol);
}

}  // namespace

TEST(cuda_linear_gemv_all_dtypes) {
  for (DType t : kDtypes)
    for (int64_t n : {1, 2, 3, 5, 8})
      for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 256}, {67, 200}, {33, 111}})
        check_linear(t, n, rc.first, rc.second, 100 + n);
}

TEST(cuda_linear_gemm_all_dtypes) {
  const bool small = small_only();
  for (DType t : kDtypes)
    for (int64_t n : {9, 17, 63, 65, 1000}) {
      if (small && n > 65) continue;
      for (auto rc : {std::pair<int64_t, int64_t>{96, 128}, {131, 264}, {260, 200}, {33, 111}})
        check_linear(t, n, rc.first, rc.second, 200 + n);
    }
}

TEST(cuda_linear_27b_shapes) {
  if (small_only()) return;
  // Decode of the 27B layer shapes (FP8 checkpoint weights; bf16 lm_head slice).
  check_linear(DType::FP8_E4M3, 1, 5120, 5120, 1);
  check_linear(DType::FP8_E4M3, 8, 1024, 17408, 2);
  check_linear(DType::FP8_E4M3, 3, 2 * 17408 / 8, 5120, 3);
  check_linear(DType::BF16, 1, 4096, 5120, 4);
  check_linear(DType::FP8_E4M3, 65, 512, 5120, 5);
}

TEST(cuda_embedding_all_dtypes) {
  pe_test::Rng rng(7);
  for (DType t : kDtypes)
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
