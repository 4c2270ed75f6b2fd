// Integer switches of model/qwen35_cuda.cpp read from the environment (PYENGINE_KV_FUSED,
// PYENGINE_EMBED_NORM); defined in core/options.cpp, the one reader of the environment. Nothing
// else may use it: options live in core/options.h.
#pragma once

namespace pe {

// The variable's value as an integer (atoi), or `fallback` when it is unset.
int env_int(const char* name, int fallback);

}  // namespace pe
