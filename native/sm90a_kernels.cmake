# Kernels written for sm_90a's own instructions (wgmma), without CUTLASS: the prefill attention
# (kernels/cuda/attention_prefill_sm90.cu). Included by native/CMakeLists.txt after
# cutlass_sm90.cmake (which sets PE_SM90_WANTED: the architectures include 90). The TU is compiled
# for sm_90a alone in an object library of its own; the files that dispatch to it see
# PE_WITH_SM90A and check at run time that the device is compute capability 9.0 and runs the image.
set(PE_SM90A_SOURCES ${CMAKE_SOURCE_DIR}/native/src/kernels/cuda/attention_prefill_sm90.cu)
if(PE_SM90_WANTED AND CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
  message(STATUS "pyengine: sm_90a kernels OFF: nvcc ${CMAKE_CUDA_COMPILER_VERSION} is older than 12.0 (wgmma)")
elseif(PE_SM90_WANTED)
  add_library(pyengine_cuda_sm90a OBJECT ${PE_SM90A_SOURCES})
  set_target_properties(pyengine_cuda_sm90a PROPERTIES CUDA_ARCHITECTURES 90a-real)
  target_include_directories(pyengine_cuda_sm90a PRIVATE ${CMAKE_SOURCE_DIR}/native/include ${CMAKE_SOURCE_DIR}/native/src)
  target_compile_definitions(pyengine_cuda_sm90a PRIVATE PE_WITH_CUDA=1)
  target_compile_options(pyengine_cuda_sm90a PRIVATE -O3 --use_fast_math -lineinfo)
  target_sources(pyengine_cuda PRIVATE $<TARGET_OBJECTS:pyengine_cuda_sm90a>)
  set_property(SOURCE ${CMAKE_SOURCE_DIR}/native/src/kernels/cuda/attention_prefill_sm80.cu APPEND PROPERTY
    COMPILE_DEFINITIONS PE_WITH_SM90A=1)
  message(STATUS "pyengine: sm_90a kernels ON (wgmma prefill attention)")
else()
  message(STATUS "pyengine: sm_90a kernels OFF: the architectures (${CMAKE_CUDA_ARCHITECTURES}) do not include 90")
endif()
