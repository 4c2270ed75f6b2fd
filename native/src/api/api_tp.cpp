// extern "C" shims of the communicators (tensor parallel; the model side is in api_model.cpp).
#include <cstring>
#include <memory>

#include "api/api_common.h"
#include "api/handles.h"
#include "comm/communicator.h"
#include "pyengine.h"
#ifdef PE_WITH_CUDA
#include "kernels/cuda/device_memory.h"
#endif

using pe::fail;

extern "C" {

int32_t pe_comm_create_cpu(const char* name, int32_t rank, int32_t size, double join_timeout_s, pe_comm** out_comm) {
  return pe::api::guarded([&] {
    if (!name || !out_comm) fail(PE_ERR_INVALID_ARGUMENT, "pe_comm_create_cpu: null argument");
    if (!(join_timeout_s > 0.0)) fail(PE_ERR_INVALID_ARGUMENT, "join_timeout_s must be > 0, got ", join_timeout_s);
    auto c = std::make_unique<pe_comm>();
    c->comm = pe::make_cpu_communicator(name, rank, size, join_timeout_s);
    *out_comm = c.release();
  });
}

int32_t pe_nccl_unique_id(uint8_t* out_id) {
  return pe::api::guarded([&] {
    if (!out_id) fail(PE_ERR_INVALID_ARGUMENT, "pe_nccl_unique_id: null argument");
    pe::nccl_unique_id(out_id);
  });
}

int32_t pe_comm_create_nccl(const uint8_t* id, int32_t rank, int32_t size, pe_comm** out_comm) {
  return pe::api::guarded([&] {
    if (!id || !out_comm) fail(PE_ERR_INVALID_ARGUMENT, "pe_comm_create_nccl: null argument");
#ifdef PE_WITH_CUDA
    auto c = std::make_unique<pe_comm>();
    c->comm = pe::make_nccl_communicator(id, rank, size, pe::cuda::stream());
    *out_comm = c.release();
#else
    fail(PE_ERR_UNSUPPORTED, "NCCL needs a build with the CUDA backend (build: ", pe_build_info(), ")");
#endif
  });
}

int32_t pe_comm_abort(pe_comm* comm, const char* why) {
  return pe::api::guarded([&] {
    if (!comm) fail(PE_ERR_INVALID_ARGUMENT, "pe_comm_abort: null comm");
    comm->comm->abort(why ? why : "aborted");
  });
}

void pe_comm_free(pe_comm* comm) { delete comm; }

}  // extern "C"
