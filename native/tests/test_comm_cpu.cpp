// The CPU communicator between processes: each test forks one process per rank, the ranks run the
// collectives against values every rank can compute, and each child's exit code says whether its
// checks held. A dead or failing rank must turn into an error on the others, never a hang.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "fork_ranks.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace {

std::string group_name(const char* test) { return std::string(test) + "-" + std::to_string(getpid()); }

// Rank r's value at index i: distinct per rank and index, exact in fp32 sums.
float value(int r, int64_t i) { return static_cast<float>((r + 1) * 1000 + (i % 997)) * 0.25f; }

}  // namespace

TEST(all_reduce_all_gather_broadcast_barrier_across_ranks) {
  for (int size : {1, 2, 3, 4}) {
    const std::string name = group_name("ops") + "-" + std::to_string(size);
    // 1.5M floats: more than one 4 MB slot, so the pieces loop runs.
    const int64_t sizes[] = {1, 17, 1000, 1500000};
    auto codes = pe_test::run_ranks(size, [&](int rank) {
      auto comm = pe::make_cpu_communicator(name, rank, size);
      if (comm->rank() != rank || comm->size() != size) return 1;
      for (int64_t n : sizes) {
        std::vector<float> x(n);
        for (int64_t i = 0; i < n; ++i) x[i] = value(rank, i);
        comm->all_reduce_sum(x.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          float want = 0.0f;
          for (int r = 0; r < size; ++r) want += value(r, i);
          if (x[i] != want) return 1;
        }
        std::vector<float> in(n), out(n * size, -1.0f);
        for (int64_t i = 0; i < n; ++i) in[i] = value(rank, i);
        comm->all_gather(in.data(), n, out.data());
        for (int r = 0; r < size; ++r)
          for (int64_t i = 0; i < n; ++i)
            if (out[r * n + i] != value(r, i)) return 1;
      }
      for (int root = 0; root < size; ++root) {
        std::vector<char> msg(5000000, rank == root ? static_cast<char>('a' + root) : 0);
        comm->broadcast(msg.data(), msg.size(), root);
        for (char c : msg)
          if (c != static_cast<char>('a' + root)) return 1;
      }
      comm->barrier();
      return 0;
    });
    for (int r = 0; r < size; ++r) CHECK_EQ(codes[r], 0);
  }
}

TEST(every_rank_gets_the_same_bits_from_all_reduce) {
  const std::string name = group_name("bits");
  auto codes = pe_test::run_ranks(3, [&](int rank) {
    auto comm = pe::make_cpu_communicator(name, rank, 3);
    pe_test::Rng rng(7 + rank);
    std::vector<float> x = rng.normals(4096);
    comm->all_reduce_sum(x.data(), 4096);
    std::vector<float> all(3 * 4096);
    comm->all_gather(x.data(), 4096, all.data());
    for (int r = 1; r < 3; ++r)
      if (std::memcmp(all.data(), all.data() + r * 4096, 4096 * sizeof(float)) != 0) return 1;
    return 0;
  });
  for (int c : codes) CHECK_EQ(c, 0);
}

TEST(a_dead_rank_makes_the_others_fail_quickly_instead_of_hanging) {
  const std::string name = group_name("dead");
  const auto t0 = std::chrono::steady_clock::now();
  auto codes = pe_test::run_ranks(3, [&](int rank) {
    auto comm = pe::make_cpu_communicator(name, rank, 3);
    if (rank == 2) _exit(0);  // dies without leaving the group
    std::vector<float> x(8, 1.0f);
    try {
      comm->all_reduce_sum(x.data(), 8);
    } catch (const pe::Error& e) {
      const std::string m = e.what();
      if (m.find("rank 2") != std::string::npos && m.find("died") != std::string::npos) return 0;
      std::printf("  rank %d: unexpected message: %s\n", rank, m.c_str());
      return 3;
    }
    return 1;  // the collective completed without rank 2
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_EQ(codes[0], 0);
  CHECK_EQ(codes[1], 0);
  CHECK(s < 5.0);
}

TEST(a_failing_rank_aborts_the_group_with_its_reason) {
  const std::string name = group_name("abort");
  auto codes = pe_test::run_ranks(2, [&](int rank) {
    auto comm = pe::make_cpu_communicator(name, rank, 2);
    if (rank == 1) {
      comm->abort("out of memory in the forward");
      return 0;
    }
    try {
      comm->barrier();
    } catch (const pe::Error& e) {
      const std::string m = e.what();
      if (m.find("rank 1 failed: out of memory in the forward") != std::string::npos) return 0;
      std::printf("  rank %d: unexpected message: %s\n", rank, m.c_str());
      return 3;
    }
    return 1;
  });
  CHECK_EQ(codes[0], 0);
  CHECK_EQ(codes[1], 0);
}

TEST(bad_arguments_are_refused_with_a_message) {
  auto threw = [](const std::function<void()>& f, const char* needle) {
    try {
      f();
    } catch (const pe::Error& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  CHECK(threw([] { pe::make_cpu_communicator("x", 2, 2); }, "rank 2 outside a group of 2"));
  CHECK(threw([] { pe::make_cpu_communicator("x", 0, 0); }, "TP size must be"));
  CHECK(threw([] { pe::make_cpu_communicator("a/b", 0, 1); }, "without '/'"));
  // A rank whose rank 0 never comes gives up after its join timeout.
  CHECK(threw([] { pe::make_cpu_communicator(group_name("nobody"), 1, 2, 0.2); }, "did not create the group"));
  std::string why;
  if (!pe::nccl_available(&why)) CHECK(!why.empty());
}
