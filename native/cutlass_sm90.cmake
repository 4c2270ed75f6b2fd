# The sm_90 FP8 prefill GEMM (kernels/cuda/linear_gemm_fp8_sm90.cu: W8A8 on CUTLASS's blockwise-
# scaled wgmma kernel, tools/gpu/KERNELS.md "Prefill"), included by native/CMakeLists.txt once the
# pyengine_cuda target exists. Built only where the architectures include 90 and the CUTLASS
# headers are found; otherwise the library builds without it (a message says why) and every FP8
# GEMM runs on the mma.sync kernel, as on sm_75.
#
# Design decision (CUTLASS from the nvidia-cutlass wheel, not a build requirement): the headers
# come from PYENGINE_CUTLASS_DIR (a CUTLASS checkout or the wheel's cutlass_library/source), else
# from the nvidia-cutlass package of the configuring Python or of $VIRTUAL_ENV (pip's isolated
# build environment sees neither otherwise). The wheel is not in pyproject's build requirements:
# it pulls cuda-python, cuda-bindings and scipy into every isolated build, CPU-only ones too, for
# headers only an sm_90 build reads. GPU machines `pip install nvidia-cutlass` first.
#
# The TU is compiled for sm_90a alone (wgmma and TMA need the arch-specific target), in an object
# library of its own; the dispatch (linear_gemm.cu, every architecture) sees PE_WITH_CUTLASS_SM90
# and checks at run time that the device is compute capability 9.0.
set(PYENGINE_CUTLASS_DIR "" CACHE PATH
    "CUTLASS (include/cute, include/cutlass, tools/util/include) for the sm_90 FP8 GEMM; empty: the nvidia-cutlass wheel")

set(PE_SM90_WANTED OFF)
foreach(arch ${CMAKE_CUDA_ARCHITECTURES})
  if(arch MATCHES "^90a?(-real|-virtual)?$")
    set(PE_SM90_WANTED ON)
  endif()
endforeach()

set(PE_CUTLASS_WHY "")
set(PE_CUTLASS_INCLUDE "")
if(NOT PE_SM90_WANTED)
  set(PE_CUTLASS_WHY "the architectures (${CMAKE_CUDA_ARCHITECTURES}) do not include 90")
elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.4)
  set(PE_CUTLASS_WHY "nvcc ${CMAKE_CUDA_COMPILER_VERSION} is older than 12.4 (CUTLASS 4's sm90 kernels)")
else()
  set(PE_CUTLASS_HINTS "")
  if(PYENGINE_CUTLASS_DIR)
    list(APPEND PE_CUTLASS_HINTS ${PYENGINE_CUTLASS_DIR})
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)  # find_spec: the package's folder without importing it
      execute_process(COMMAND ${Python3_EXECUTABLE} -c
        "import importlib.util as u; s = u.find_spec('cutlass_library'); print(list(s.submodule_search_locations)[0] + '/source' if s else '')"
        OUTPUT_VARIABLE PE_CUTLASS_WHEEL OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(PE_CUTLASS_WHEEL)
        list(APPEND PE_CUTLASS_HINTS ${PE_CUTLASS_WHEEL})
      endif()
    endif()
    if(DEFINED ENV{VIRTUAL_ENV})
      file(GLOB PE_CUTLASS_VENV "$ENV{VIRTUAL_ENV}/lib/python3*/site-packages/cutlass_library/source")
      list(APPEND PE_CUTLASS_HINTS ${PE_CUTLASS_VENV})
    endif()
  endif()
  foreach(dir ${PE_CUTLASS_HINTS})
    if(NOT PE_CUTLASS_INCLUDE AND EXISTS "${dir}/include/cutlass/version.h"
       AND EXISTS "${dir}/tools/util/include/cutlass/util/packed_stride.hpp")
      set(PE_CUTLASS_INCLUDE "${dir}/include;${dir}/tools/util/include")
      file(STRINGS "${dir}/include/cutlass/version.h" PE_CUTLASS_MAJOR REGEX "#define CUTLASS_MAJOR ")
      string(REGEX REPLACE ".* ([0-9]+).*" "\\1" PE_CUTLASS_MAJOR "${PE_CUTLASS_MAJOR}")
      if(PE_CUTLASS_MAJOR LESS 4)
        set(PE_CUTLASS_INCLUDE "")
        set(PE_CUTLASS_WHY "CUTLASS ${PE_CUTLASS_MAJOR}.x in ${dir}; the blockwise FP8 kernel needs 4.x")
      endif()
    endif()
  endforeach()
  if(NOT PE_CUTLASS_INCLUDE AND NOT PE_CUTLASS_WHY)
    set(PE_CUTLASS_WHY "no CUTLASS headers (pip install nvidia-cutlass, or -DPYENGINE_CUTLASS_DIR=...)")
  endif()
endif()

if(PE_CUTLASS_INCLUDE)
  add_library(pyengine_cuda_sm90 OBJECT ${CMAKE_SOURCE_DIR}/native/src/kernels/cuda/linear_gemm_fp8_sm90.cu)
  set_target_properties(pyengine_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES 90a-real)
  target_include_directories(pyengine_cuda_sm90 PRIVATE ${CMAKE_SOURCE_DIR}/native/include ${CMAKE_SOURCE_DIR}/native/src)
  target_include_directories(pyengine_cuda_sm90 SYSTEM PRIVATE ${PE_CUTLASS_INCLUDE})
  # NDEBUG in every build type: a device-side assert is a call inside the kernel, and ptxas then
  # serializes the wgmma pipeline (warning C7510). No --use_fast_math: the quantizer's divisions
  # are rounded as the CPU twin's.
  target_compile_definitions(pyengine_cuda_sm90 PRIVATE PE_WITH_CUDA=1 PE_WITH_CUTLASS_SM90=1 NDEBUG)
  target_compile_options(pyengine_cuda_sm90 PRIVATE -O3 --expt-relaxed-constexpr -lineinfo)
  target_sources(pyengine_cuda PRIVATE $<TARGET_OBJECTS:pyengine_cuda_sm90>)
  set_source_files_properties(${CMAKE_SOURCE_DIR}/native/src/kernels/cuda/linear_gemm.cu PROPERTIES
    COMPILE_DEFINITIONS PE_WITH_CUTLASS_SM90=1)
  list(GET PE_CUTLASS_INCLUDE 0 PE_CUTLASS_SHOWN)
  message(STATUS "pyengine: sm_90 FP8 GEMM ON (CUTLASS ${PE_CUTLASS_SHOWN}, compiled for sm_90a)")
else()
  message(STATUS "pyengine: sm_90 FP8 GEMM OFF: ${PE_CUTLASS_WHY}; FP8 prefill GEMMs run on mma.sync")
endif()
