// Decode steps replayed from CUDA graphs on the engine's stream (step_graphs.cu); host-callable,
// no CUDA headers needed.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>

typedef struct CUgraphExec_st* cudaGraphExec_t;  // same typedef as cuda_runtime.h

namespace pe {
namespace cuda {

// Decode steps replayed from CUDA graphs, one executable graph per step shape (engine option
// cuda_graphs; model/backend_cuda.cpp explains the choice). Not thread-safe: the model calls it under
// its forward lock.
class StepGraphs {
 public:
  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  // Runs `launches` (stream work only) on the engine's stream. The first step of a shape `key`
  // runs directly; later ones are captured into a graph that updates the shape's executable graph
  // (re-instantiated when the update is refused), which is then launched. A capture that fails
  // is ended, nothing of it has run, and pe::Error says why.
  void run(int64_t key, const std::function<void()>& launches);

 private:
  struct Exec {
    cudaGraphExec_t exec = nullptr;
    bool seen = false;
  };
  std::unordered_map<int64_t, Exec> execs_;
  int64_t n_replays_ = 0, n_instantiations_ = 0;
};

}  // namespace cuda
}  // namespace pe
