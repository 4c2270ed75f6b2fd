"""Builds and runs the C-level tests (native/tests, ctest) from the source tree.

Where `pip install .` has already compiled this tree (pyproject.toml's build-dir, build/wheel),
the tests are built in that folder: only the test programs compile, the library's objects are
reused. Otherwise they are built in a folder of their own (build/ctest), CPU backend only.
"""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_BUILD = os.path.join(ROOT, "build", "wheel")
OWN_BUILD = os.path.join(ROOT, "build", "ctest")


def cmake_cache(build: str) -> dict[str, str]:
    """NAME -> value of a build folder's CMakeCache.txt ({} when there is none)."""
    values = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.rstrip("\n").partition("=")
                if sep and not line.startswith(("#", "//")):
                    values[name.split(":")[0]] = value
    except FileNotFoundError:
        pass
    return values


def wheel_build_args() -> list[str] | None:
    """Extra configure arguments to reuse build/wheel, or None when it cannot be reused."""
    cache = cmake_cache(WHEEL_BUILD)
    if not cache or os.path.realpath(cache.get("CMAKE_HOME_DIRECTORY", "")) != os.path.realpath(ROOT):
        return None
    args = ["-DPYENGINE_TESTS=ON"]
    if cache.get("CMAKE_GENERATOR") == "Ninja" and not os.path.exists(cache.get("CMAKE_MAKE_PROGRAM", "")):
        # pip's isolated build environment may have provided a ninja that is gone now.
        ninja = shutil.which("ninja")
        if ninja is None:
            return None
        args.append(f"-DCMAKE_MAKE_PROGRAM={ninja}")
    return args


def cpu_test_targets() -> list[str]:
    names = (os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, "native", "tests", "test_*.cpp")))
    return sorted(names)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_ctest():
    reuse = wheel_build_args()
    if reuse is not None:
        build, configure = WHEEL_BUILD, reuse
    else:
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        build, configure = OWN_BUILD, [*gen, "-DPYENGINE_TESTS=ON", "-DPYENGINE_CUDA=OFF",
                                       "-DCMAKE_BUILD_TYPE=Release"]  # fmt: skip
    cfg = subprocess.run(["cmake", "-S", ROOT, "-B", build, *configure], capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    targets = cpu_test_targets()
    assert len(targets) >= 10, targets
    make = subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", *targets],
                          capture_output=True, text=True)  # fmt: skip
    assert make.returncode == 0, make.stdout[-4000:] + make.stderr[-4000:]
    # -LE gpu: a CUDA build folder also lists the op harness on the CUDA backend, which needs a GPU.
    run = subprocess.run(["ctest", "--test-dir", build, "-LE", "gpu", "--output-on-failure"],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert f"100% tests passed" in run.stdout and f"out of {len(targets)}" in run.stdout, run.stdout[-2000:]
