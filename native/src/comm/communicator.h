// Collective operations between the ranks of a tensor-parallel group, one process per rank.
//
// Two implementations behind one interface:
// - the CPU communicator: processes on one machine meet in a POSIX shared-memory segment (the CPU
//   backend's tensor parallel, and how CI tests TP without a GPU);
// - the NCCL communicator: one GPU per rank, NCCL loaded at run time (comm/nccl_communicator.cpp),
//   so a build or a machine without NCCL still runs everything but TP > 1 on CUDA.
//
// Every rank calls the same collectives in the same order with the same sizes (the engine's steps
// guarantee it). Data pointers live on the communicator's device. Calls are blocking for the CPU
// communicator and stream-ordered for NCCL (queued on the stream it was made with).
//
// A peer that dies or fails never leaves the others waiting forever: the CPU communicator watches
// its peers' processes and a shared failure flag while it waits, and throws pe::Error naming the
// rank; `abort` sets that flag for a rank that fails on its own (its peers' collectives then throw).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/buffer.h"

namespace pe {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;

  // data[0 .. n) = the element-wise sum of every rank's data[0 .. n) (in place). Every rank ends
  // with the same bits: ranks are added in rank order.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // out[r * n .. (r + 1) * n) = rank r's in[0 .. n), on every rank. in and out must not overlap.
  virtual void all_gather(const float* in, int64_t n, float* out) = 0;
  // bytes of `data` from rank `root` to every other rank's `data`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Marks the group failed (this rank cannot go on): peers' pending and later calls throw. Never
  // throws itself.
  virtual void abort(const std::string& why) noexcept = 0;
};

// Joins the CPU group `name` (a short token shared by the ranks, e.g. the parent's pid and a random
// number) as `rank` of `size`. Rank 0 creates the segment; the others wait up to `join_timeout_s`
// for it. Throws pe::Error on a bad argument, a timeout or a system error.
std::unique_ptr<Communicator> make_cpu_communicator(const std::string& name, int rank, int size,
                                                    double join_timeout_s = 60.0);

// NCCL: a unique id made by rank 0 (nccl_unique_id) and passed to the others out of band; one
// rank per device; collectives queued on `stream` (a cudaStream_t). Throws pe::Error naming why
// when this build or machine has no NCCL (nccl_available says so beforehand).
constexpr size_t kNcclUniqueIdBytes = 128;
bool nccl_available(std::string* why);
void nccl_unique_id(uint8_t out[kNcclUniqueIdBytes]);
std::unique_ptr<Communicator> make_nccl_communicator(const uint8_t id[kNcclUniqueIdBytes], int rank, int size,
                                                     void* stream);

}  // namespace pe
