// The library's options that come from the environment: the one place that reads it.
//
// Design decision: kernels and models take no switches from the environment; what a deployment
// may tune is a typed field here, with its default and the reason it is an option, read once at
// the first call of options(). Kernel tuning that tools and tests vary (cuda::GemvTuning,
// attention_decode_set_variant) is set through functions, never through the environment.
#pragma once

namespace pe {

struct Options {
  // PYENGINE_NUM_THREADS: threads of the CPU backend's pool, the caller included, used where the
  // engine is given no thread count (pe_engine_params.num_threads 0, no --threads); 0 or less =
  // one per hardware thread. Why: a host shared with other processes (CI, several servers) wants
  // fewer threads than cores without every caller passing a number.
  int num_threads = 0;
};

// The options read from the environment at the first call (a variable unset or not a number
// keeps the default). Thread-safe; the result never changes afterwards.
const Options& options();

}  // namespace pe
