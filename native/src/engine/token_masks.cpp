#include "engine/token_masks.h"

#include <chrono>

#include "core/error.h"

namespace pe {

void TokenMasks::expect(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  entries_[id];
}

void TokenMasks::set(uint64_t id, int64_t index, const uint32_t* words, int64_t n_words) {
  if (words ? n_words != n_words_ : n_words != 0)
    fail(PE_ERR_INVALID_ARGUMENT, "token mask of request ", id, ": ", n_words, " words, expected ",
         words ? n_words_ : 0, words ? " (ceil(vocab_size / 32))" : " with a null mask");
  if (index < 0) fail(PE_ERR_INVALID_ARGUMENT, "token mask of request ", id, ": token_index ", index, " < 0");
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    Entry& e = it->second;
    e.index = index;
    e.has_mask = words != nullptr;
    if (words) e.words.assign(words, words + n_words);
  }
  cv_.notify_all();
}

void TokenMasks::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    it->second.cancelled = true;
  }
  cv_.notify_all();
}

void TokenMasks::shutdown() {
  {
    std::lock_guard<std::mutex> g(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

TokenMasks::Wait TokenMasks::wait(uint64_t id, int64_t index, double timeout_s, std::vector<uint32_t>& out,
                                  bool* has_mask) {
  std::unique_lock<std::mutex> lk(mu_);
  Entry* e = nullptr;
  auto ready = [&] {
    auto it = entries_.find(id);
    e = it == entries_.end() ? nullptr : &it->second;
    return shutdown_ || !e || e->cancelled || e->index == index;
  };
  if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) return Wait::TimedOut;
  if (shutdown_ || !e || e->cancelled) return Wait::Cancelled;
  *has_mask = e->has_mask;
  if (e->has_mask) out = e->words;
  return Wait::Ready;
}

void TokenMasks::forget(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  entries_.erase(id);
}

}  // namespace pe
