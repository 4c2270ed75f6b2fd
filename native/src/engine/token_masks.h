// Grammar token masks handed in from other threads (pe_engine_set_token_mask) to the engine
// thread, which waits for a request's mask between its forward and its sampling.
//
// Design: the caller (pyengine's dispatcher thread, with llguidance) computes the mask of token
// i + 1 as soon as it reads token i's event; the engine flushes that event before it runs the
// next step's forward, so the mask is computed while the forward runs and the wait before the
// sampling is short or none. Requests without token_mask never touch this class, so their steps
// are unchanged. Speculative decoding will ask for one mask per draft position here (index
// n_generated + k for the k-th draft) and hand each verify row its mask.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace pe {

class TokenMasks {
 public:
  enum class Wait { Ready, Cancelled, TimedOut };

  explicit TokenMasks(int64_t n_words) : n_words_(n_words) {}

  int64_t n_words() const { return n_words_; }
  // A request that will take masks: from now on set() keeps its masks.
  void expect(uint64_t id);
  // Stores the mask of token `index` (words == nullptr: unconstrained). Ignored for ids not
  // expected (unknown or finished). Throws INVALID_ARGUMENT for a wrong word count.
  void set(uint64_t id, int64_t index, const uint32_t* words, int64_t n_words);
  // Wakes a wait on `id` (the request is being cancelled).
  void cancel(uint64_t id);
  // Wakes every wait for good (the engine stops).
  void shutdown();
  // Waits until the mask of token `index` of `id` is set (Ready: *has_mask says whether it
  // constrains, its words are in `out`), the request is cancelled or shut down, or timeout_s.
  Wait wait(uint64_t id, int64_t index, double timeout_s, std::vector<uint32_t>& out, bool* has_mask);
  // The request ended: its mask and any later set() for it are dropped.
  void forget(uint64_t id);

 private:
  struct Entry {
    int64_t index = -1;  // token index of `words`; -1: none yet
    bool has_mask = false;
    bool cancelled = false;
    std::vector<uint32_t> words;
  };
  int64_t n_words_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Entry> entries_;
  bool shutdown_ = false;
};

}  // namespace pe
