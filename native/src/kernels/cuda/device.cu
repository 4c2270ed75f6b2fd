// Host helpers of the CUDA backend: device probe and argument checks shared by the launchers.
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {

namespace {
__global__ void pdl_probe_kernel() {}

// An attribute of the current device, at least 1, read once per device (known: one slot per
// device): launchers ask at every launch.
int device_attr(std::atomic<int>* known, cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  if (cached && (v = known[dev].load(std::memory_order_relaxed)) > 0) return v;
  PE_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  v = v > 1 ? v : 1;
  if (cached) known[dev].store(v, std::memory_order_relaxed);
  return v;
}
}  // namespace

// PDL needs the library's sm_90 code compiled from compute_90+ PTX: a compute_75 build JIT-compiled
// on an H200 runs sm_90 machine code without griddepcontrol.wait, so it could read its inputs before
// the previous kernel wrote them (hence ptxVersion too). One answer per process: GPUs assumed alike.
bool pdl_supported() {
  static const bool on = [] {
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, pdl_probe_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.ptxVersion >= 90 && a.binaryVersion >= 90;
  }();
  return on;
}

int sm_count() {
  static std::atomic<int> known[64] = {};
  return device_attr(known, cudaDevAttrMultiProcessorCount);
}

int compute_capability() {
  static std::atomic<int> known[64] = {};
  int dev = 0, major = 0, minor = 0;
  PE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  int v = cached ? known[dev].load(std::memory_order_relaxed) : 0;
  if (v > 0) return v;
  PE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  PE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  v = 10 * major + minor;
  if (cached) known[dev].store(v, std::memory_order_relaxed);
  return v;
}

int smem_optin() {
  static std::atomic<int> known[64] = {};
  return device_attr(known, cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

int smem_per_sm() {
  static std::atomic<int> known[64] = {};
  return device_attr(known, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
}

// The ops whose kernels decode every weight format and the tile layout (linear_common.cuh).
static bool linear_op(const char* op) {
  return std::strcmp(op, "cuda::linear") == 0 || std::strcmp(op, "cuda::linear_swiglu") == 0 ||
         std::strcmp(op, "cuda::linear_add_norm") == 0;
}

void check_weight(const WeightView& w, const char* op) {
  if (w.tile != 0 && !linear_op(op))  // only the linear kernels know the layout
    fail(PE_ERR_UNSUPPORTED, op, ": weights in the GEMV tile layout are read by linear only");
  switch (w.dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      break;
    case DType::FP8_E4M3:
      if (!w.block_scale || w.block <= 0)
        fail(PE_ERR_INVALID_ARGUMENT, op, ": FP8 weight without block scales");
      break;
    case DType::I8:
    case DType::NVFP4:
      // Only the linear kernels decode these (linear_common.cuh); weight_at does not.
      if (!linear_op(op))
        fail(PE_ERR_UNSUPPORTED, op, ": ", dtype_name(w.dtype), " weights are supported by linear only");
      if (w.dtype == DType::NVFP4) break;
      if (!w.row_scale) fail(PE_ERR_INVALID_ARGUMENT, op, ": I8 weight without row scales");
      break;
    default:
      fail(PE_ERR_UNSUPPORTED, op, ": unsupported weight dtype ", static_cast<int>(w.dtype));
  }
  if (w.dtype == DType::NVFP4) {
    if (!w.group_scale) fail(PE_ERR_INVALID_ARGUMENT, op, ": NVFP4 weight without group scales");
    if (w.cols % 16 != 0)
      fail(PE_ERR_INVALID_ARGUMENT, op, ": NVFP4 weight with cols ", w.cols, " (not a multiple of 16)");
  }
  if (!w.data && w.rows > 0 && w.cols > 0) fail(PE_ERR_INVALID_ARGUMENT, op, ": null weight data");
}

}  // namespace cuda
}  // namespace pe
