// Runs a test body in one forked process per rank (the tensor-parallel tests): each child's exit
// code says whether its checks held (0), one failed (1), it threw (2) or a message was wrong (3).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

namespace pe_test {

inline std::vector<int> run_ranks(int size, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  std::fflush(stdout);  // a child must not print the parent's buffered output again
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 2;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::printf("  rank %d threw: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

}  // namespace pe_test
