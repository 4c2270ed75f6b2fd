// Error checks of CUDA runtime calls (CUDA-compiled files only: needs cuda_runtime.h).
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

// Throws pe::Error(PE_ERR_INTERNAL) with file:line and the CUDA message when `call` fails.
// Throws pe::Error(PE_ERR_INTERNAL) with file:line and the CUDA message when `call` fails.
#define PE_CUDA_CHECK(call)                                                                     \
  do {                                                                                          \
    const cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess)                                                                    \
      ::pe::fail(PE_ERR_INTERNAL, __FILE__, ":", __LINE__, ": ", #call, ": ",                   \
                 cudaGetErrorString(err_));                                                     \
  } while (0)

// After a <<<>>> launch: configuration errors surface here (execution errors at the next sync).
#define PE_CUDA_LAUNCH_CHECK() PE_CUDA_CHECK(cudaGetLastError())
