"""Checks the device KV encoders kv_enc_fp8 / kv_enc_fp4 (native/src/kernels/cuda/kv_codec.cuh)
against the CPU's f32_to_fp8e4m3 / f32_to_fp4e2m1 (native/src/core/dtype.cpp) on every one of the
2^32 float bit patterns, on the host: the two functions' source is cut from the header and compiled
by g++ with host stand-ins for the CUDA intrinsics (__float_as_uint, __fmul_rn, __fmaf_rn, rintf, min, isnan, signbit). The
device build adds FTZ (a subnormal reads as 0), under which both encoders give the same code as for
a subnormal here. No GPU needed; ~25 s (--stride N: every Nth pattern and every one whose
low 16 bits are 0, 1, 0x8000 or 0xffff, which holds each midpoint and tie; the CPU tests run that). Repo root:

  python3 tools/gpu/kv_encoders_exhaustive.py [--stride 1]
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

PRELUDE = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#define __device__
#define __forceinline__ inline
static inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
static inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
using std::isnan;
using std::signbit;
namespace pe { uint8_t f32_to_fp8e4m3(float f); uint8_t f32_to_fp4e2m1(float f); }
"""

MAIN = r"""
int main(int argc, char** argv) {
  const unsigned long long stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  unsigned long long bad8 = 0, bad4 = 0, n = 0;
  const auto check = [&](uint32_t i) {
    ++n;
    const float f = __uint_as_float(i);
    if (kv_enc_fp8(f) != pe::f32_to_fp8e4m3(f) && bad8++ < 5)
      std::printf("fp8 %08x: device %02x, cpu %02x\n", i, kv_enc_fp8(f), pe::f32_to_fp8e4m3(f));
    if (kv_enc_fp4(f) != pe::f32_to_fp4e2m1(f) && bad4++ < 5)
      std::printf("fp4 %08x: device %x, cpu %x\n", i, kv_enc_fp4(f), pe::f32_to_fp4e2m1(f));
  };
  for (unsigned long long i = 0; i < (1ull << 32); i += stride) check(static_cast<uint32_t>(i));
  // With a stride, also every pattern whose low 16 bits are 0 (each midpoint and rounding tie of
  // both formats is one) and its neighbours.
  if (stride > 1)
    for (uint32_t hi = 0; hi < (1u << 16); ++hi)
      for (uint32_t lo : {0x0u, 0x1u, 0xffffu, 0x8000u}) check(hi << 16 | lo);
  std::printf("%llu float bit patterns (stride %llu%s): fp8 mismatches %llu, fp4 mismatches %llu\n", n, stride,
              stride > 1 ? ", with the ties" : "", bad8, bad4);
  return bad8 || bad4;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stride", type=int, default=1, help="check every Nth bit pattern")
    args = ap.parse_args()
    header = (ROOT / "native/src/kernels/cuda/kv_codec.cuh").read_text()
    start = header.index("__device__ __forceinline__ uint8_t kv_enc_fp8(float f)")
    end = header.index("// ---- chunk decoders")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = pathlib.Path(tmp, "check.cpp"), pathlib.Path(tmp, "check")
        src.write_text(PRELUDE + header[start:end] + MAIN)
        subprocess.run(["g++", "-O2", "-std=c++17", "-o", str(exe), str(src), str(ROOT / "native/src/core/dtype.cpp"),
                        f"-I{ROOT / 'native/src'}", f"-I{ROOT / 'native/include'}"], check=True)
        return subprocess.run([str(exe), str(max(args.stride, 1))]).returncode


if __name__ == "__main__":
    sys.exit(main())
