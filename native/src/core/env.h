// Integer switches read from the environment (PYENGINE_*: A/B runs of whole steps on the GPU).
#pragma once
#include <cstdlib>

namespace pe {

// The variable's value as an integer, or `fallback` when it is unset.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace pe
