# Sourced by the GPU scripts that pack binaries on the dev machine (tools/gpu/prefill_call.sh,
# tools/gpu/lab/linear_gemm/ab_prefill.sh).
#
# cuda_lib_dir BUILD: the CUDA runtime's folder BUILD's library links from (its -L that is not the stubs').
cuda_lib_dir() {
  ninja -C "$1" -t commands pyengine | tail -1 | tr ' ' '\n' | grep '^-L.*/lib$' | grep -v stubs | head -1 | cut -c3-
}
# relink_whole BUILD ARCHIVE OUT: BUILD's libpyengine.so linked again into OUT with all of ARCHIVE (a
# CUDA archive of BUILD or a copy of it with objects replaced): the library's own link keeps only
# the objects the core calls, the op harness calls others (kv_write, rope_neox).
relink_whole() {
  local cmd
  cmd=$(ninja -C "$1" -t commands pyengine | tail -1 | sed "s#-Wl,--no-whole-archive  libpyengine_cuda.a#$2 -Wl,--no-whole-archive#;
    s# libpyengine_cuda.a # $2 #g; s#-o libpyengine.so#-o $3#")
  (cd "$1" && eval "$cmd")
}
