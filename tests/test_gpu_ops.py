"""Every op of the CUDA backend against the CPU (native/tests/test_backend_ops.cpp), built here
with the CUDA backend for sm_75 and sm_90 and run on the GPU, then again under compute-sanitizer
memcheck at small sizes. Run with `pytest -m gpu` on a machine with a GPU."""

import glob
import os
import shutil
import subprocess

import pytest

from pyengine._native import cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="no CUDA device or no CUDA build")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tools/gpu/pytest_gpu.sh points this at its own build (same options): the library is built once.
BUILD = os.environ.get("PYENGINE_GPU_BUILD", os.path.join(ROOT, "build", "gpu"))


@pytest.fixture(scope="module")
def binaries():
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DPYENGINE_CUDA=ON", "-DPYENGINE_TESTS=ON",
                    "-DCMAKE_CUDA_ARCHITECTURES=75;90"], check=True, capture_output=True)  # fmt: skip
    subprocess.run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 4)], check=True, capture_output=True)
    found = sorted(glob.glob(os.path.join(BUILD, "test_backend_ops")))
    assert found
    return found


def test_cuda_ops_match_their_cpu_twins(binaries):
    for b in binaries:
        run = subprocess.run([b, "--backend", "cuda"], capture_output=True, text=True, timeout=900)
        print(run.stdout[-2000:])
        assert run.returncode == 0, f"{os.path.basename(b)}\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
        assert "SKIP" not in run.stdout


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer is not installed")
def test_cuda_ops_are_memcheck_clean(binaries):
    env = dict(os.environ, PE_TEST_SMALL="1")
    for b in binaries:
        run = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", b, "--backend", "cuda"],
                             capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
        tail = run.stdout[-1500:]
        assert run.returncode == 0 and "ERROR SUMMARY: 0 errors" in tail, f"{os.path.basename(b)}\n{tail}"
