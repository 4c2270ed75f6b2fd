// The options registry (core/options.h): PYENGINE_NUM_THREADS, read once at the first call of
// options(), is the thread pool's default size (before and after a resize to the default). The
// environment is read once per process, so this executable sets it before anything reads it.
#include <cstdlib>

#include "check.h"
#include "core/options.h"
#include "core/threadpool.h"

using namespace pe;

TEST(num_threads_from_the_environment) {
  setenv("PYENGINE_NUM_THREADS", "11", 1);  // not a likely core count
  CHECK_EQ(options().num_threads, 11);
  CHECK_EQ(num_threads(), 11);  // the pool starts at the option
  set_num_threads(1);
  CHECK_EQ(num_threads(), 1);
  set_num_threads(0);  // back to the default
  CHECK_EQ(num_threads(), 11);
  setenv("PYENGINE_NUM_THREADS", "4", 1);  // read once: later changes do not count
  CHECK_EQ(options().num_threads, 11);
}
