"""Shared by the tests of the measuring tools: run a `pyengine` command and keep its files."""
import json
import shutil
import subprocess
import sys

from server_process import ARTIFACTS, REPO, server_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m pyengine.cli ARGV` as a user runs it (a child process, the tree under test)."""
    return subprocess.run([sys.executable, "-m", "pyengine.cli", *argv], cwd=ARTIFACTS, env=server_env(),
                          check=False, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def outputs(tmp_path, name: str) -> tuple[str, str]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.png")


def load_and_keep(json_path: str, png_path: str | None = None) -> dict:
    """The JSON result; the files are copied to tests/artifacts/ to be looked at after the run."""
    with open(json_path) as f:
        result = json.load(f)
    shutil.copy(json_path, ARTIFACTS)
    if png_path:
        with open(png_path, "rb") as f:
            assert f.read(8) == PNG_MAGIC
        shutil.copy(png_path, ARTIFACTS)
    return result


__all__ = ["REPO", "load_and_keep", "outputs", "read_json", "run_cli"]
