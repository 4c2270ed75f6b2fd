// The NCCL communicator: one GPU per rank, collectives queued on the model's stream.
//
// Design decision (NCCL at run time): the types come from nccl.h found at build time (the CUDA
// toolkit's, the system's or the nvidia-nccl wheel's; CMake option PYENGINE_NCCL), the library is
// opened with dlopen when a communicator is first made (the path CMake found first, then the
// loader's search for libnccl.so.2). A machine without NCCL loads and runs the library as ever;
// only TP > 1 on CUDA refuses, with the reason.
#include "comm/communicator.h"
#include "core/error.h"

#ifdef PE_WITH_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>

#ifndef PE_NCCL_LIBRARY
#define PE_NCCL_LIBRARY ""
#endif

namespace pe {
namespace {

struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  std::string why_not;  // empty once loaded
};

const NcclApi& api() {
  static NcclApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    for (const char* name : {PE_NCCL_LIBRARY, "libnccl.so.2", "libnccl.so"}) {
      if (*name && (h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!h) {
      a.why_not = std::string("libnccl.so.2 could not be loaded (") + (dlerror() ? dlerror() : "not found") +
                  "): install NCCL (e.g. pip install nvidia-nccl-cu13) for tensor parallel on CUDA";
      return;
    }
    auto sym = [&](const char* s) {
      void* p = dlsym(h, s);
      if (!p && a.why_not.empty()) a.why_not = std::string("libnccl lacks ") + s;
      return p;
    };
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.comm_abort = reinterpret_cast<decltype(a.comm_abort)>(sym("ncclCommAbort"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.all_gather = reinterpret_cast<decltype(a.all_gather)>(sym("ncclAllGather"));
    a.broadcast = reinterpret_cast<decltype(a.broadcast)>(sym("ncclBroadcast"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
  });
  return a;
}

const NcclApi& loaded() {
  const NcclApi& a = api();
  if (!a.why_not.empty()) fail(PE_ERR_UNSUPPORTED, a.why_not);
  return a;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail(PE_ERR_INTERNAL, what, ": ", loaded().error_string(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const uint8_t id[kNcclUniqueIdBytes], int rank, int size, void* stream)
      : rank_(rank), size_(size), stream_(static_cast<cudaStream_t>(stream)) {
    if (size < 1 || rank < 0 || rank >= size) fail(PE_ERR_INVALID_ARGUMENT, "rank ", rank, " outside a group of ", size);
    ncclUniqueId uid;
    static_assert(sizeof(uid) == kNcclUniqueIdBytes, "ncclUniqueId size");
    std::memcpy(&uid, id, sizeof(uid));
    check(loaded().comm_init_rank(&comm_, size, uid, rank), "ncclCommInitRank");
    token_ = Buffer(Device::CUDA, sizeof(float));
  }
  ~NcclCommunicator() override {
    if (comm_) (aborted_ ? loaded().comm_abort : loaded().comm_destroy)(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CUDA; }

  void all_reduce_sum(float* data, int64_t n) override {
    check(loaded().all_reduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void all_gather(const float* in, int64_t n, float* out) override {
    check(loaded().all_gather(in, out, static_cast<size_t>(n), ncclFloat32, comm_, stream_), "ncclAllGather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check(loaded().broadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  }
  void barrier() override {
    all_reduce_sum(token_.as<float>(), 1);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) fail(PE_ERR_INTERNAL, "barrier: stream synchronize failed");
  }
  void abort(const std::string&) noexcept override { aborted_ = true; }

 private:
  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  Buffer token_;
  bool aborted_ = false;
};

}  // namespace

bool nccl_available(std::string* why) {
  const NcclApi& a = api();
  if (why) *why = a.why_not;
  return a.why_not.empty();
}

void nccl_unique_id(uint8_t out[kNcclUniqueIdBytes]) {
  ncclUniqueId uid;
  check(loaded().get_unique_id(&uid), "ncclGetUniqueId");
  std::memcpy(out, &uid, kNcclUniqueIdBytes);
}

std::unique_ptr<Communicator> make_nccl_communicator(const uint8_t id[kNcclUniqueIdBytes], int rank, int size,
                                                     void* stream) {
  return std::make_unique<NcclCommunicator>(id, rank, size, stream);
}

}  // namespace pe

#else  // no nccl.h at build time

namespace pe {

namespace {
const char* kNoNccl =
    "this build has no NCCL (nccl.h was not found when it was built): tensor parallel on CUDA needs it; install "
    "NCCL (e.g. pip install nvidia-nccl-cu13) and rebuild";
}

bool nccl_available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
void nccl_unique_id(uint8_t*) { fail(PE_ERR_UNSUPPORTED, kNoNccl); }
std::unique_ptr<Communicator> make_nccl_communicator(const uint8_t*, int, int, void*) {
  fail(PE_ERR_UNSUPPORTED, kNoNccl);
}

}  // namespace pe

#endif
