// A persistent process-wide thread pool for the CPU kernels.
//
// parallel_for splits [0, n) into chunks of at least min_grain indices and runs fn(begin, end) on
// them, the calling thread included; it returns when every chunk is done. Threads: callable from
// any thread. One parallel_for uses the pool at a time; a call made while the pool is busy (from
// another thread) or from inside a running fn (nested) runs fn(0, n) inline on the calling thread,
// so it never deadlocks. An exception thrown by fn is rethrown to the caller (the first one).
#pragma once
#include <cstdint>
#include <functional>

namespace pe {

void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                  int64_t min_grain = 1);

// Threads a parallel_for may use, the caller included (>= 1). Default: options().num_threads
// (PYENGINE_NUM_THREADS) where >= 1, else std::thread::hardware_concurrency().
int num_threads();
// Resizes the pool (n < 1 means the default). Waits for a running parallel_for to finish.
void set_num_threads(int n);

}  // namespace pe
