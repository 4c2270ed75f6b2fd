// Decode steps as CUDA graphs (engine option cuda_graphs; model/backend_cuda.cpp says why): the
// launches of a step are captured from the engine's stream, applied to the executable graph of
// that step shape with cudaGraphExecUpdate (a fresh instantiation where the update is refused)
// and launched as one graph.
#include <cuda_runtime.h>

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/step_graphs.h"

namespace pe {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // capture errors are not sticky: leave no stale error for the next launch check
    fail(PE_ERR_INTERNAL, "cuda_graphs: ", what, ": ", cudaGetErrorString(e));
  }
}

// Ends a capture that an op broke off (its graph, if any, is dropped); never throws.
void abandon_capture(cudaStream_t st) {
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(st, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

}  // namespace

StepGraphs::~StepGraphs() {
  for (auto& [key, e] : execs_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  if (n_replays_ > 0)
    std::fprintf(stderr, "pyengine: cuda_graphs: %lld decode steps replayed, %lld graph instantiations\n",
                 static_cast<long long>(n_replays_), static_cast<long long>(n_instantiations_));
}

void StepGraphs::run(int64_t key, const std::function<void()>& launches) {
  Exec& e = execs_[key];
  if (!e.seen) {
    // The first step of a shape runs directly: kernels load (and anything lazy happens) outside
    // a capture, and a shape that occurs once costs no capture.
    e.seen = true;
    launches();
    return;
  }
  cudaStream_t st = stream();
  // Thread-local mode: an unsafe call (sync, allocation, pageable copy) on this thread during the
  // capture fails instead of being recorded; other threads (stats readers) are unaffected.
  check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cannot begin a capture");
  try {
    launches();
  } catch (const std::exception& ex) {
    abandon_capture(st);
    const Error* pe_err = dynamic_cast<const Error*>(&ex);
    fail(pe_err ? pe_err->code : PE_ERR_INTERNAL, "cuda_graphs: capturing a decode step failed (nothing of it ran): ",
         ex.what());
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(st, &graph);
  if (end != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    check(end != cudaSuccess ? end : cudaErrorStreamCaptureInvalidated,
          "the decode step could not be captured (an op in it synchronizes, allocates or copies from host memory)");
  }
  bool updated = false;
  if (e.exec) {
    cudaGraphExecUpdateResultInfo info{};
    // Same kernels in the same order with new arguments (positions, page tables, split counts)
    // update in place; a different topology (e.g. attention's combine pass appearing) is refused.
    updated = cudaGraphExecUpdate(e.exec, graph, &info) == cudaSuccess;
    if (!updated) {
      cudaGetLastError();
      cudaGraphExecDestroy(e.exec);
      e.exec = nullptr;
    }
  }
  if (!updated) {
    const cudaError_t inst = cudaGraphInstantiateWithFlags(&e.exec, graph, 0);
    if (inst != cudaSuccess) {
      e.exec = nullptr;
      cudaGraphDestroy(graph);
      check(inst, "cannot instantiate the decode step's graph");
    }
    ++n_instantiations_;
  }
  cudaGraphDestroy(graph);  // the executable graph keeps its own copy
  if (n_replays_++ == 0) std::fprintf(stderr, "pyengine: cuda_graphs: replaying decode steps from CUDA graphs\n");
  check(cudaGraphLaunch(e.exec, st), "cannot launch the decode step's graph");
}

}  // namespace cuda
}  // namespace pe
