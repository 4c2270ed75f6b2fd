// Shared by the extern "C" shims: per-thread last error and the exception-to-status wrapper.
#pragma once
#include <cstdint>
#include <string>

namespace pe::api {

void set_last_error(const std::string& msg);
void clear_last_error();

// Runs fn; returns PE_OK, or the status of the pe::Error / a generic code for other exceptions.
template <class F>
int32_t guarded(F&& fn);

}  // namespace pe::api

#include "api/api_common_impl.h"
