#include "api/api_common.h"

#include <cstring>

#include "core/buffer.h"
#include "pyengine.h"

#ifndef PE_BUILD_INFO
#define PE_BUILD_INFO "cpu"
#endif

namespace pe::api {

static thread_local std::string g_last_error;

void set_last_error(const std::string& msg) { g_last_error = msg; }
void clear_last_error() { g_last_error.clear(); }

}  // namespace pe::api

extern "C" {

int32_t pe_api_version(void) { return PE_API_VERSION; }
const char* pe_build_info(void) { return PE_BUILD_INFO; }
const char* pe_last_error(void) { return pe::api::g_last_error.c_str(); }

int32_t pe_device_available(const char* device) {
  if (!device) return 0;
  if (std::strcmp(device, "cpu") == 0) return 1;
  if (std::strcmp(device, "cuda") == 0) return pe::device_usable(pe::Device::CUDA) ? 1 : 0;
  return 0;
}

}
