#include "core/options.h"

#include <cstdlib>


namespace pe {

namespace {

// The variable as a base-10 integer, or `fallback` when it is unset or has no number.
int read_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end == v ? fallback : static_cast<int>(n);
}

}  // namespace

const Options& options() {
  static const Options o = [] {
    Options r;
    r.num_threads = read_int("PYENGINE_NUM_THREADS", r.num_threads);
    return r;
  }();
  return o;
}

}  // namespace pe
