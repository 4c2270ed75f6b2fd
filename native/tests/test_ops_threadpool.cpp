// The global thread pool: coverage of every index exactly once, grains, nested calls (inline, no
// deadlock), concurrent callers from several threads, exceptions, resizing, and the inline
// back-off after a job waited on a slow (descheduled) worker.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"
#include "core/threadpool.h"

using namespace pe;

namespace {

// Runs parallel_for over n and checks that each index was visited exactly once.
bool covers_once(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  for (auto& h : hits) h.store(0);
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      },
      grain);
  for (auto& h : hits)
    if (h.load() != 1) return false;
  return true;
}

}  // namespace

TEST(covers_every_index_once) {
  CHECK(num_threads() >= 1);
  for (int64_t n : {1, 2, 3, 17, 63, 65, 130, 1000, 100003})
    for (int64_t grain : {1, 7, 64, 1000000}) CHECK(covers_once(n, grain));
  bool called = false;
  parallel_for(0, [&](int64_t, int64_t) { called = true; });
  CHECK(!called);
}

TEST(grain_limits_chunking) {
  std::atomic<int> calls{0};
  std::atomic<int64_t> min_len{1 << 30};
  parallel_for(
      100,
      [&](int64_t b, int64_t e) {
        ++calls;
        int64_t cur = min_len.load();
        while (e - b < cur && !min_len.compare_exchange_weak(cur, e - b)) {
        }
      },
      40);
  CHECK(calls.load() <= 2);  // at most floor(100 / 40) = 2 chunks
  CHECK(min_len.load() >= 40);
}

TEST(nested_calls_run_inline) {
  std::atomic<int64_t> total{0};
  parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(1000, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
  });
  CHECK_EQ(total.load(), 8000);
}

TEST(concurrent_callers) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        const int64_t n = 50 + 37 * t + rep;
        std::vector<int> hits(static_cast<size_t>(n), 0);
        parallel_for(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i] += 1;
        });
        for (int h : hits) bad += h != 1;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(bad.load(), 0);
}

TEST(exceptions_propagate) {
  bool caught = false;
  try {
    parallel_for(100, [&](int64_t b, int64_t) {
      if (b == 0) throw std::runtime_error("boom");
    });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  CHECK(caught);
  CHECK(covers_once(1000, 1));  // the pool still works afterwards
}

TEST(resize) {
  const int before = num_threads();
  set_num_threads(3);
  CHECK_EQ(num_threads(), 3);
  CHECK(covers_once(12345, 1));
  set_num_threads(1);
  CHECK_EQ(num_threads(), 1);
  CHECK(covers_once(777, 1));
  set_num_threads(before);
  CHECK_EQ(num_threads(), before);
  CHECK(covers_once(4096, 3));
}

TEST(many_small_jobs) {
  // Decode-like: thousands of tiny jobs back to back must all complete correctly.
  int64_t sum = 0;
  std::vector<int64_t> part(64);
  for (int rep = 0; rep < 5000; ++rep) {
    std::fill(part.begin(), part.end(), 0);
    parallel_for(64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) part[i] = i;
    });
    for (int64_t v : part) sum += v;
  }
  CHECK_EQ(sum, int64_t{5000} * (63 * 64 / 2));
}

TEST(slow_worker_backoff) {
  // A worker that holds its chunk far longer than the caller worked (as when another process
  // preempts it) switches the pool to inline jobs for a while; results stay exact throughout and
  // parallel jobs resume afterwards.
  const int before = num_threads();
  set_num_threads(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> worker_ran{false};
  parallel_for(
      2,
      [&](int64_t, int64_t) {
        if (std::this_thread::get_id() != caller) {
          worker_ran = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();  // give a worker time to join
        while (!worker_ran && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1))
          std::this_thread::yield();
      },
      1);
  if (worker_ran) {
    int calls = 0;
    bool off_caller = false;
    parallel_for(1000, [&](int64_t b, int64_t e) {
      ++calls;  // inline: one call on this thread, so no race
      off_caller |= std::this_thread::get_id() != caller || b != 0 || e != 1000;
    });
    CHECK_EQ(calls, 1);
    CHECK(!off_caller);
  }
  CHECK(covers_once(1000, 1));
  bool caught = false;
  try {
    parallel_for(100, [&](int64_t b, int64_t) {
      if (b == 0) throw std::runtime_error("boom");
    });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  CHECK(caught);
  // Back to parallel once the back-off has passed.
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  bool parallel = false;
  for (int rep = 0; rep < 200 && !parallel; ++rep) {
    std::atomic<bool> other{false};
    parallel_for(
        2,
        [&](int64_t, int64_t) {
          if (std::this_thread::get_id() != caller) {
            other = true;
            return;
          }
          const auto t0 = std::chrono::steady_clock::now();
          while (!other && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(5))
            std::this_thread::yield();
        },
        1);
    parallel = other;
  }
  CHECK(parallel);
  CHECK(covers_once(4096, 3));
  set_num_threads(before);
}
