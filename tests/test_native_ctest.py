"""Builds and runs the C-level tests (native/tests, ctest) from the source tree."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "ctest")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_ctest():
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DPYENGINE_TESTS=ON", "-DPYENGINE_CUDA=OFF",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)  # fmt: skip
    build = subprocess.run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 2)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    run = subprocess.run(["ctest", "--test-dir", BUILD, "--output-on-failure"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
