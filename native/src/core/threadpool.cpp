// The global pool behind parallel_for: n_threads - 1 workers plus the calling thread.
//
// Job protocol (one atomic word `state_` = generation << 32 | joined << 1 | closed):
//   the caller publishes a job with a new generation (open, nobody joined) and works on chunks
//   itself; a worker that sees the new generation joins with a CAS that only succeeds while the
//   job is open, grabs chunks from an atomic counter, then counts itself in `done_`. When no
//   chunk is left the caller closes the job and waits only for the workers that joined.
// Design decision: a worker that was descheduled (busy or oversubscribed machine, CI) never
// delays a job it did not join, so small decode jobs cost no more than running them inline.
// Workers spin for a short while before sleeping on a condition variable: decode issues hundreds
// of small jobs per token, and a futex wake-up per job would cost more than the work.
// A worker that joined and was then preempted (another process wants the core) makes the caller
// wait a scheduler time slice (milliseconds) for a job worth microseconds. So when the caller
// waits much longer than it worked itself, the pool runs jobs inline for a while (kBackoff)
// before trying again: on a busy machine decode degrades to one thread instead of collapsing.
// While waiting, the caller yields its core after a short spin (the preempted worker may need it).
#include "core/threadpool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/options.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PE_CPU_RELAX() _mm_pause()
#else
#define PE_CPU_RELAX() std::this_thread::yield()
#endif

namespace pe {
namespace {

thread_local bool t_inside_job = false;  // set on workers and on a caller while it runs a job
constexpr int kSpins = 20000;
constexpr int kWaitSpins = 2000;  // caller: spins before yielding while waiting for workers
using Clock = std::chrono::steady_clock;
constexpr auto kSlowWait = std::chrono::microseconds(300);  // beyond 2x the caller's own work
constexpr auto kBackoff = std::chrono::milliseconds(50);

int default_threads() {
  if (options().num_threads >= 1) return options().num_threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

inline uint32_t gen_of(uint64_t s) { return static_cast<uint32_t>(s >> 32); }

class Pool {
 public:
  Pool() { start(default_threads()); }
  ~Pool() { stop(); }

  int size() const { return n_threads_; }

  void resize(int n) {
    std::lock_guard<std::mutex> submit(submit_mu_);
    stop();
    start(n < 1 ? default_threads() : n);
  }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t max_chunks = n / grain;  // every chunk gets at least `grain` indices
    if (max_chunks <= 1 || n_threads_ <= 1 || t_inside_job) return fn(0, n);
    std::unique_lock<std::mutex> submit(submit_mu_, std::try_to_lock);
    if (!submit.owns_lock()) return fn(0, n);  // busy with another thread's job: run inline
    const Clock::time_point t_start = Clock::now();
    if (t_start < inline_until_) {
      submit.unlock();
      return fn(0, n);
    }

    // A few chunks per thread balance uneven work (causal attention) at little cost.
    fn_ = &fn;
    n_ = n;
    n_chunks_ = std::min<int64_t>(max_chunks, int64_t{4} * n_threads_);
    next_chunk_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t gen = gen_of(state_.load(std::memory_order_relaxed)) + 1;
    {
      std::lock_guard<std::mutex> lk(mu_);
      state_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
    }
    if (sleeping_.load(std::memory_order_acquire) > 0) cv_work_.notify_all();

    t_inside_job = true;
    work();
    t_inside_job = false;

    const uint64_t closed = state_.fetch_or(1, std::memory_order_acq_rel);
    const int joined = static_cast<int>((closed >> 1) & 0x7fffffff);
    if (done_.load(std::memory_order_acquire) < joined) {
      const Clock::time_point t_wait = Clock::now();
      for (int spin = 0; done_.load(std::memory_order_acquire) < joined; ++spin) {
        if (spin < kWaitSpins) {
          PE_CPU_RELAX();
        } else if (spin < kSpins) {
          std::this_thread::yield();
        } else {
          std::unique_lock<std::mutex> lk(mu_);
          cv_done_.wait(lk, [&] { return done_.load(std::memory_order_acquire) >= joined; });
        }
      }
      const Clock::time_point t_end = Clock::now();
      if (t_end - t_wait > kSlowWait + 2 * (t_wait - t_start)) inline_until_ = t_end + kBackoff;
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void start(int n) {
    n_threads_ = std::max(1, n);
    quit_.store(false);
    const uint32_t gen = gen_of(state_.load());
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_.store(true);
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Runs chunks of the current job until none is left.
  void work() {
    for (;;) {
      const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
      if (c >= n_chunks_) return;
      const int64_t begin = n_ * c / n_chunks_, end = n_ * (c + 1) / n_chunks_;
      try {
        (*fn_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  // Joins job `gen` if it is still open; false when it closed (or a newer one started).
  bool try_join(uint32_t gen) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (gen_of(s) == gen && !(s & 1)) {
      if (state_.compare_exchange_weak(s, s + 2, std::memory_order_acq_rel)) return true;
    }
    return false;
  }

  void worker_loop(uint32_t seen) {
    t_inside_job = true;  // anything a worker runs is inside a job: nested calls run inline
    for (;;) {
      int spin = 0;
      while (gen_of(state_.load(std::memory_order_acquire)) == seen && !quit_.load()) {
        if (++spin < kSpins) {
          PE_CPU_RELAX();
          continue;
        }
        std::unique_lock<std::mutex> lk(mu_);
        sleeping_.fetch_add(1);
        cv_work_.wait(lk, [&] {
          return gen_of(state_.load(std::memory_order_acquire)) != seen || quit_.load();
        });
        sleeping_.fetch_sub(1);
        break;
      }
      if (quit_.load()) return;
      seen = gen_of(state_.load(std::memory_order_acquire));
      if (!try_join(seen)) continue;
      work();
      done_.fetch_add(1, std::memory_order_acq_rel);
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;         // guards sleeping/waking and error_
  std::condition_variable cv_work_, cv_done_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<bool> quit_{false};
  std::atomic<int64_t> next_chunk_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, n_chunks_ = 0;
  Clock::time_point inline_until_{};  // guarded by submit_mu_
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_grain) {
  pool().run(n, fn, min_grain);
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) { pool().resize(n); }

}  // namespace pe
