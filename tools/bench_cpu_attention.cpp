// CPU attention benchmark (not a test): cpu::attention_paged at the embedded model's shape (6
// query heads, 2 KV heads, head_dim 64, fp32 cache in shuffled pages of 16) for a prefill chunk
// of n_q queries after `depth` cached tokens, and a decode step (n_q 1). GFLOP/s counts
// 4 * heads * head_dim per (query, visible key): the two products. Best of --reps calls: one
// thread by its thread CPU time (steady on a shared machine), all threads by wall time.
//
//   ninja -C build/dev bench_cpu_attention && build/dev/bench_cpu_attention [n_q] [reps]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "core/threadpool.h"
#include "kernels/ops.h"

using namespace pe;

namespace {

double seconds(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Case {
  int64_t n_q, depth;
  std::vector<float> k, v, q, gate, out;
  std::vector<int32_t> table;
  cpu::PagedKV kv;
};

constexpr int64_t kHeads = 6, kKvHeads = 2, kDim = 64, kPage = 16;

void fill(Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const int64_t n_pages = (c.depth + c.n_q + kPage - 1) / kPage;
  c.k.resize(n_pages * kPage * kKvHeads * kDim);
  c.v.resize(c.k.size());
  for (float& x : c.k) x = normal(rng);
  for (float& x : c.v) x = normal(rng);
  c.table.resize(n_pages);
  for (int64_t i = 0; i < n_pages; ++i) c.table[i] = static_cast<int32_t>(i);
  std::shuffle(c.table.begin(), c.table.end(), rng);
  c.q.resize(c.n_q * kHeads * kDim);
  c.gate.resize(c.q.size());
  c.out.resize(c.q.size());
  for (float& x : c.q) x = normal(rng);
  for (float& x : c.gate) x = normal(rng);
  c.kv.k = c.k.data();
  c.kv.v = c.v.data();
  c.kv.page_size = kPage;
  c.kv.n_kv_heads = kKvHeads;
  c.kv.head_dim = kDim;
}

// Best seconds of `reps` calls, timed by `clock`.
double best_of(Case& c, int reps, clockid_t clock) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = seconds(clock);
    cpu::attention_paged(c.q.data(), c.n_q, c.depth, kHeads, c.kv, c.table.data(), 0.125f, c.gate.data(),
                         c.out.data());
    best = std::min(best, seconds(clock) - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n_q = argc > 1 ? std::atoll(argv[1]) : 512;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = num_threads();
  std::mt19937 rng(1);
  std::printf("n_q  depth  1 thread GFLOP/s  %d threads GFLOP/s\n", threads);
  for (int64_t q : {n_q, int64_t{1}})
    for (int64_t depth : {1000, 4000, 8000, 14000}) {
      Case c{q, depth, {}, {}, {}, {}, {}, {}, {}};
      fill(c, rng);
      const double flops = 4.0 * kHeads * kDim * q * (depth + (q + 1) / 2.0);
      set_num_threads(1);
      const double one = best_of(c, reps, CLOCK_THREAD_CPUTIME_ID);
      set_num_threads(threads);
      const double all = best_of(c, reps, CLOCK_MONOTONIC);
      std::printf("%4lld %6lld  %16.1f  %18.1f\n", static_cast<long long>(q), static_cast<long long>(depth),
                  flops / one * 1e-9, flops / all * 1e-9);
    }
  return 0;
}
