"""The C-level tests (native/tests, ctest) built with AddressSanitizer and
UndefinedBehaviorSanitizer (CMake option PYENGINE_SANITIZE, its own build folder) and run: any
out-of-bounds access, use after free, leak or undefined behaviour aborts its test."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "sanitize")
SANITIZERS = "address,undefined"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_ctest_under_asan_and_ubsan():
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DPYENGINE_TESTS=ON", "-DPYENGINE_CUDA=OFF",
                    f"-DPYENGINE_SANITIZE={SANITIZERS}", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                   check=True, capture_output=True)  # fmt: skip
    build = subprocess.run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 2)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:strict_string_checks=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")  # fmt: skip
    run = subprocess.run(["ctest", "--test-dir", BUILD, "-LE", "gpu", "--output-on-failure"],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "100% tests passed" in run.stdout, run.stdout[-2000:]
