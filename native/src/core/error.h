// Errors inside the library: C++ exceptions carrying a PE_ERR_* status code. The C API shims
// (api/) catch them and turn them into a status + pe_last_error(); nothing throws across the API.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "pyengine.h"

namespace pe {

struct Error : std::runtime_error {
  int32_t code;
  Error(int32_t c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from its parts: fail(PE_ERR_INVALID_ARGUMENT, "max_batch must be >= 1, got ", n).
template <class... A>
[[noreturn]] void fail(int32_t code, const A&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  throw Error(code, os.str());
}

}  // namespace pe
