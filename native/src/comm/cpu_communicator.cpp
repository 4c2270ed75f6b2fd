// The CPU communicator: ranks on one machine meet in a POSIX shared-memory segment.
//
// Layout: a header (barrier counter and generation, each rank's pid and state, the failure flag
// and its message) and one slot of kSlotBytes per rank. A collective moves its data through the
// slots in pieces of a slot: each rank writes its piece into its own slot, all meet at a barrier,
// each reads what it needs (the sum over slots in rank order, or every slot), all meet again so
// the slots can be reused.
//
// Design decision (waiting): a rank waits by spinning briefly, then sleeping in growing steps up to
// a millisecond, so a worker rank idling between requests costs almost nothing. While it waits it
// checks the failure flag and, every few milliseconds, that each peer process is still alive (not
// gone, not a zombie): a dead peer turns into an error within milliseconds, never a hang. There is
// no timeout on a collective itself: a worker waits for the next step as long as the server idles.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm/communicator.h"
#include "core/error.h"

namespace pe {
namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = size_t(4) << 20;
constexpr uint32_t kMagic = 0x70654331;  // "peC1"
constexpr size_t kMessageBytes = 512;

enum RankState : int32_t { kAbsent = 0, kJoined = 1, kLeft = 2 };

struct Header {
  std::atomic<uint32_t> magic;  // written last by rank 0: the header is ready
  int32_t size;
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> failed;  // 0, or 1 + the rank that failed
  std::atomic<int32_t> pid[kMaxRanks];
  std::atomic<int32_t> state[kMaxRanks];
  char message[kMessageBytes];  // why it failed (written before `failed` is set)
};

size_t segment_bytes(int size) { return (sizeof(Header) + 63) / 64 * 64 + kSlotBytes * size; }

std::string shm_name(const std::string& name) { return "/pyengine-tp-" + name; }

// True when process `pid` is gone or a zombie.
bool process_dead(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // "pid (comm) S ...": the state follows the name
  return close && (close[2] == 'Z' || close[2] == 'X');
}

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(const std::string& name, int rank, int size, double join_timeout_s)
      : name_(shm_name(name)), rank_(rank), size_(size) {
    if (size < 1 || size > kMaxRanks) fail(PE_ERR_INVALID_ARGUMENT, "TP size must be 1..", kMaxRanks, ", got ", size);
    if (rank < 0 || rank >= size) fail(PE_ERR_INVALID_ARGUMENT, "rank ", rank, " outside a group of ", size);
    if (name.empty() || name.find('/') != std::string::npos)
      fail(PE_ERR_INVALID_ARGUMENT, "communicator name must be a non-empty token without '/', got '", name, "'");
    bytes_ = segment_bytes(size);
    if (rank == 0) create(); else open_existing(join_timeout_s);
    hdr_->pid[rank].store(static_cast<int32_t>(getpid()));
    hdr_->state[rank].store(kJoined);
    barrier();  // every rank has mapped the segment: its name can go
    if (rank == 0) shm_unlink(name_.c_str());
  }

  ~CpuCommunicator() override {
    if (hdr_) {
      hdr_->state[rank_].store(kLeft);
      munmap(hdr_, bytes_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CPU; }

  void all_reduce_sum(float* data, int64_t n) override {
    check_count(n, "all_reduce_sum");
    const int64_t piece = kSlotBytes / sizeof(float);
    for (int64_t off = 0; off < n; off += piece) {
      const int64_t m = std::min(piece, n - off);
      std::memcpy(slot(rank_), data + off, m * sizeof(float));
      barrier();
      float* out = data + off;
      const float* s0 = static_cast<const float*>(slot(0));
      std::memcpy(out, s0, m * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* s = static_cast<const float*>(slot(r));
        for (int64_t i = 0; i < m; ++i) out[i] += s[i];
      }
      barrier();
    }
  }

  void all_gather(const float* in, int64_t n, float* out) override {
    check_count(n, "all_gather");
    const int64_t piece = kSlotBytes / sizeof(float);
    for (int64_t off = 0; off < n; off += piece) {
      const int64_t m = std::min(piece, n - off);
      std::memcpy(slot(rank_), in + off, m * sizeof(float));
      barrier();
      for (int r = 0; r < size_; ++r) std::memcpy(out + r * n + off, slot(r), m * sizeof(float));
      barrier();
    }
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail(PE_ERR_INVALID_ARGUMENT, "broadcast root ", root, " outside a group of ", size_);
    if (bytes > 0 && !data) fail(PE_ERR_INVALID_ARGUMENT, "broadcast: null data");
    char* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t m = std::min(kSlotBytes, bytes - off);
      if (rank_ == root) std::memcpy(slot(root), p + off, m);
      barrier();
      if (rank_ != root) std::memcpy(p + off, slot(root), m);
      barrier();
    }
  }

  void barrier() override {
    Header& h = *hdr_;
    const uint32_t gen = h.generation.load(std::memory_order_acquire);
    if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
      h.arrived.store(0, std::memory_order_relaxed);
      h.generation.fetch_add(1, std::memory_order_release);
      return;
    }
    wait_until([&] { return h.generation.load(std::memory_order_acquire) != gen; }, "a barrier");
  }

  void abort(const std::string& why) noexcept override {
    if (!hdr_) return;
    int32_t expected = 0;
    // The message first, then the flag: a reader that sees the flag sees the message.
    if (hdr_->failed.load() == 0) {
      std::snprintf(hdr_->message, kMessageBytes, "%s", why.c_str());
      hdr_->failed.compare_exchange_strong(expected, rank_ + 1);
    }
  }

 private:
  void create() {
    shm_unlink(name_.c_str());  // a stale segment of a crashed group of the same name
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) fail(PE_ERR_INTERNAL, "shm_open(", name_, "): ", std::strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      const int e = errno;
      close(fd);
      shm_unlink(name_.c_str());
      fail(PE_ERR_OUT_OF_MEMORY, "shared memory of ", bytes_, " bytes for ", size_, " ranks: ", std::strerror(e));
    }
    map(fd);
    hdr_->size = size_;
    hdr_->magic.store(kMagic, std::memory_order_release);
  }

  void open_existing(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const int fd = shm_open(name_.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes_) {
          map(fd);
          if (hdr_->magic.load(std::memory_order_acquire) == kMagic) {
            if (hdr_->size != size_)
              fail(PE_ERR_INVALID_ARGUMENT, "rank ", rank_, " joins a group of ", size_, " but rank 0 made one of ",
                   hdr_->size);
            return;
          }
          munmap(hdr_, bytes_);
          hdr_ = nullptr;
        } else {
          close(fd);
        }
      }
      if (std::chrono::steady_clock::now() > deadline)
        fail(PE_ERR_STATE, "rank ", rank_, ": rank 0 did not create the group '", name_, "' within ", timeout_s, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  void map(int fd) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) fail(PE_ERR_INTERNAL, "mmap of the TP group segment: ", std::strerror(errno));
    hdr_ = static_cast<Header*>(p);
  }

  void* slot(int r) const {
    return reinterpret_cast<char*>(hdr_) + (sizeof(Header) + 63) / 64 * 64 + kSlotBytes * r;
  }

  void check_count(int64_t n, const char* what) const {
    if (n < 0) fail(PE_ERR_INVALID_ARGUMENT, what, ": negative count ", n);
  }

  // Why the group cannot go on (the group failed or a peer is gone), or empty.
  std::string trouble(const char* what) const {
    std::ostringstream os;
    auto failed = [&] {
      const int32_t f = hdr_->failed.load(std::memory_order_acquire);
      if (f != 0) os << "tensor-parallel rank " << f - 1 << " failed: " << hdr_->message;
      return f != 0;
    };
    if (failed()) return os.str();
    for (int r = 0; r < size_; ++r)  // a dead peer first: it is the cause when others left after it
      if (r != rank_ && hdr_->state[r].load(std::memory_order_acquire) == kJoined && process_dead(hdr_->pid[r].load())) {
        os << "tensor-parallel rank " << r << " (pid " << hdr_->pid[r].load() << ") died while rank " << rank_
           << " waited for " << what;
        return os.str();
      }
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && hdr_->state[r].load(std::memory_order_acquire) == kLeft) {
        if (failed()) return os.str();  // it failed, then left, after our first look at the flag
        os << "tensor-parallel rank " << r << " left the group while rank " << rank_ << " waited for " << what;
        return os.str();
      }
    return {};
  }

  template <class Done>
  void wait_until(Done done, const char* what) {
    int spins = 0;
    auto sleep = std::chrono::microseconds(2);
    auto next_check = std::chrono::steady_clock::now();
    while (!done()) {
      if (++spins < 2000) continue;
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_check) {
        // A peer may finish the wait and leave between our look at `done` and at the peers.
        const std::string why = trouble(what);
        if (!why.empty() && !done()) {
          abort(why);  // the peers learn the cause, not only that this rank left
          fail(PE_ERR_STATE, why);
        }
        next_check = now + std::chrono::milliseconds(5);
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
  }

  std::string name_;
  int rank_, size_;
  size_t bytes_ = 0;
  Header* hdr_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_cpu_communicator(const std::string& name, int rank, int size, double join_timeout_s) {
  return std::make_unique<CpuCommunicator>(name, rank, size, join_timeout_s);
}

}  // namespace pe
