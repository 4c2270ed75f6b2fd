#pragma once
#include <new>
#include <stdexcept>

#include "core/error.h"
#include "pyengine.h"

namespace pe::api {

template <class F>
int32_t guarded(F&& fn) {
  try {
    fn();
    return PE_OK;
  } catch (const pe::Error& e) {
    set_last_error(e.what());
    return e.code;
  } catch (const std::invalid_argument& e) {
    // Kernels and pools check their arguments with std::invalid_argument.
    set_last_error(e.what());
    return PE_ERR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    set_last_error("out of memory");
    return PE_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return PE_ERR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return PE_ERR_INTERNAL;
  }
}

}  // namespace pe::api
