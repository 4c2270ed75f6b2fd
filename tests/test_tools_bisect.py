"""`pyengine bench --bisect-metric/--bisect-threshold` as a `git bisect run` predicate.

The throwaway repository's "engine" is the stub server's config: a planted commit drops the
acceptance at draft position 3 from 0.61 to 0.43 (the first users' RMSNorm regression), and a
later commit, which bisect tests first, does not "build" (invalid JSON) and is skipped; git
bisect must name the planted commit.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from openai_stub import StubProcess
from server_process import server_env

from pyengine.tools import commands

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_stub.py")
FAST = ["--max_tokens", "4", "--runs", "1", "--concurrency", "1", "--kinds", "code", "--warmup", "0"]


def bench(base_url: str, metric: str, threshold: float) -> int:
    return commands.main(["bench", "--base_url", base_url, *FAST, "--bisect-metric", metric,
                          "--bisect-threshold", str(threshold)])  # fmt: skip


@pytest.mark.parametrize("accept, expected", [([0.9, 0.8, 0.61], 0), ([0.9, 0.8, 0.435], 1), (None, 125)])
def test_acceptance_verdicts(tmp_path, accept, expected):
    with StubProcess({"accept": accept}, tmp_path) as stub:
        assert bench(stub.base_url, "accept_pos3", 0.55) == expected


def test_speed_and_latency_verdicts_follow_the_measured_side(tmp_path):
    # 4 tokens 20 ms apart after a ~0.1 s first token: about 27 tok/s (sleeps only ever run longer).
    with StubProcess({"token_delay_s": 0.02, "prefill_s_per_kchar": 0.6}, tmp_path) as stub:
        assert bench(stub.base_url, "tok_s", 10) == 0
        assert bench(stub.base_url, "tok_s", 80) == 1
        assert bench(stub.base_url, "ttft_s", 0.5) == 0  # lower is better
        assert bench(stub.base_url, "ttft_s", 0.05) == 1
        assert bench(stub.base_url, "tpot_s:code", 0.05) == 0


def test_an_unreachable_endpoint_is_a_skip(capsys):
    assert bench("http://127.0.0.1:9/v1", "tok_s", 1) == 125
    assert "error" in capsys.readouterr().err


def test_an_engine_that_does_not_load_in_process_is_a_skip(tmp_path):
    assert commands.main(["bench", "--model", str(tmp_path / "missing"), *FAST, "--bisect-metric", "tok_s",
                          "--bisect-threshold", "1"]) == 125  # fmt: skip
    broken = tmp_path / "libpyengine.so"  # what a half-finished build leaves behind
    broken.write_bytes(b"not a shared library")
    env = dict(server_env(), PYENGINE_LIBRARY=str(broken))
    proc = subprocess.run([sys.executable, "-m", "pyengine.cli", "bench", *FAST, "--bisect-metric", "tok_s",
                           "--bisect-threshold", "1"], env=env, check=False, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 125, proc.stderr
    assert "Traceback" not in proc.stderr and "failed to load" in proc.stderr


def _git(repo, *args) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_git_bisect_run_finds_the_planted_acceptance_regression(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = {}
    for i in range(1, 9):
        accept = [0.9, 0.78, 0.609 if i < 5 else 0.435]
        text = json.dumps({"accept": accept, "token_delay_s": 0.001})
        if i == 6:
            text = text[:-1]  # this commit does not build: bisect must skip it
        (repo / "engine.json").write_text(text)
        (repo / "history.txt").write_text(f"change {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", f"change {i}")
        commits[i] = _git(repo, "rev-parse", "HEAD").strip()
    check = tmp_path / "check.py"  # what a user would write: build (or exit 125), serve, bench
    check.write_text(textwrap.dedent(f"""
        import json, subprocess, sys
        sys.path.insert(0, {os.path.dirname(STUB)!r})
        from openai_stub import StubProcess
        try:
            config = json.load(open("engine.json"))
        except ValueError:
            print("build failed: skip")
            sys.exit(125)
        with StubProcess(config, {str(tmp_path)!r}) as stub:
            sys.exit(subprocess.call([sys.executable, "-m", "pyengine.cli", "bench", "--base_url",
                                      stub.base_url, *{FAST!r}, "--bisect-metric", "accept_pos3",
                                      "--bisect-threshold", "0.55"]))
    """))
    _git(repo, "bisect", "start", commits[8], commits[1])
    proc = subprocess.run(["git", "bisect", "run", sys.executable, str(check)], cwd=repo, env=server_env(),
                          check=False, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{commits[5]} is the first bad commit" in proc.stdout, proc.stdout
    assert "change 5" in proc.stdout and "build failed: skip" in proc.stdout
