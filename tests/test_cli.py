"""The `pyengine` command as a user meets it: each bad invocation ends in one clear line on
stderr (no traceback), --version, help on every flag, and `generate` keeping the reasoning
apart from the answer. Every case runs the real command in a child process."""
import argparse
import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import server_env

import pyengine
from pyengine import cli, serve
from pyengine.cli_args import cuda_problem

PACKAGE = Path(pyengine.__file__).resolve().parent


def pyengine_cmd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyengine", *args], capture_output=True, text=True,
                          timeout=timeout, env=server_env(), cwd=Path(__file__).parent, check=False)


def assert_one_line_error(proc: subprocess.CompletedProcess, prog: str, *fragments: str) -> None:
    err = proc.stderr
    assert "Traceback" not in err and "Traceback" not in proc.stdout, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert proc.returncode == 2, (proc.returncode, err)


@pytest.fixture(scope="module")
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


BAD_INVOCATIONS = [
    (["serve", "--port", "99999"], "pyengine serve", ["--port", "0-65535"]),
    (["serve", "--port", "http"], "pyengine serve", ["--port", "not an integer"]),
    (["serve", "--host", "192.0.2.1"], "pyengine serve", ["192.0.2.1:8000", "address"]),
    (["serve", "/no/such/model"], "pyengine serve", ["model directory not found: /no/such/model"]),
    (["serve", "--max_batch", "0"], "pyengine serve", ["--max_batch", "positive"]),
    (["serve", "--kv_cache_bytes", "lots"], "pyengine serve", ["--kv_cache_bytes", "'lots'"]),
    (["serve", "--workers", "-1"], "pyengine serve", ["--workers"]),
    (["generate", "--prompt", "hi", "--threads", "-3"], "pyengine generate", ["--threads", "'-3'"]),
    (["generate", "--prompt", "hi", "--gpu_mem_ratio", "1.5"], "pyengine generate", ["--gpu_mem_ratio"]),
    (["generate", "--prompt", "hi", "--temperature", "warm"], "pyengine generate", ["--temperature"]),
    (["generate", "--prompt", "hi", "--top_p", "0"], "pyengine generate", ["--top_p"]),
    (["generate", "--prompt", "hi", "--max_tokens", "-5"], "pyengine generate", ["--max_tokens"]),
    (["generate", "--prompt", "hi", "--model", "/no/such/model"], "pyengine generate",
     ["model directory not found"]),
    (["generate", "--prompt", "hi", "--device", "gpu"], "pyengine generate", ["--device", "'gpu'"]),
    (["generate"], "pyengine generate", ["--prompt"]),
    ([], "pyengine", ["generate,serve"]),
    (["bench", "--runs", "0"], "pyengine bench", ["--runs"]),
    (["frobnicate"], "pyengine", ["frobnicate"]),
]


@pytest.mark.parametrize("argv, prog, fragments", BAD_INVOCATIONS, ids=lambda v: " ".join(v) if
                         isinstance(v, list) else None)  # fmt: skip
def test_bad_invocation_is_one_line(argv, prog, fragments):
    assert_one_line_error(pyengine_cmd(*argv), prog, *fragments)


def test_model_dir_without_config(tmp_path):
    assert_one_line_error(pyengine_cmd("generate", "--prompt", "hi", "--model", str(tmp_path)),
                          "pyengine generate", "no config.json")  # fmt: skip


def test_malformed_config_is_reported_before_gunicorn_starts(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(pyengine_cmd("serve", str(tmp_path), "--port", "0", timeout=30), "pyengine serve",
                          f"{tmp_path}/config.json", "model_type")  # fmt: skip


def test_port_in_use_says_why_before_gunicorn_starts(busy_port):
    proc = pyengine_cmd("serve", "--port", str(busy_port), timeout=30)
    assert_one_line_error(proc, "pyengine serve", f"127.0.0.1:{busy_port}", "Address already in use",
                          "another program is listening there")  # fmt: skip


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"]])
def test_device_cuda_without_a_gpu(command):
    if cuda_problem() is None:
        pytest.skip("this machine has a usable GPU")
    proc = pyengine_cmd(*command, "--device", "cuda")
    assert_one_line_error(proc, f"pyengine {command[0]}", "--device cuda")
    assert "PYENGINE_CUDA=ON" in proc.stderr or "no usable CUDA GPU" in proc.stderr


def test_version():
    proc = pyengine_cmd("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"pyengine {pyengine.__version__} (native library: cpu"), proc.stdout


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_flag_has_help():
    top = cli.build_parser()
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    serve_parser = argparse.ArgumentParser()
    serve.add_serve_arguments(serve_parser)
    parsers = {"pyengine": top, "generate": subparsers.choices["generate"], "serve": serve_parser}
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in parsers.items()
               for a in _flags(p) if not a.help]  # fmt: skip
    assert not missing, missing
    assert len(_flags(parsers["generate"])) > 20 and len(_flags(serve_parser)) > 25


def test_generate_keeps_reasoning_apart_from_the_answer():
    proc = pyengine_cmd("generate", "--prompt", "What is 478 + 56?", "--thinking", "on", "--max_tokens", "200",
                        "--threads", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "534\n"  # the answer alone: no reasoning, no think tags
    err = proc.stderr
    assert "<think>" not in err and "</think>" not in err
    reasoning = err[err.index("[thinking]\n") + 11:err.index("\n[answer]\n")]
    assert "478 + 56" in reasoning and "534" in reasoning
    assert "finish_reason=stop" in err.splitlines()[-1]

    quiet = pyengine_cmd("generate", "--prompt", "What is 478 + 56?", "--thinking", "on", "--max_tokens", "200",
                         "--threads", "1", "--show_reasoning", "off")  # fmt: skip
    assert quiet.stdout == "534\n" and "[thinking]" not in quiet.stderr and "478 + 56" not in quiet.stderr


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The pyengine modules that a module imports, at any depth of its code (lazy imports too)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import module` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycles_in_pyengine():
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}
    assert "pyengine.cli_args" in graph["pyengine.serve"]  # the graph sees real edges
    assert "pyengine.cli_args" in graph["pyengine.tools.commands"]

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return [node, nxt]
            if nxt not in seen:
                seen.add(nxt)
                rest = cycle_from(start, nxt, seen)
                if rest:
                    return [node, *rest]
        return None

    cycles = [c for name in graph if (c := cycle_from(name, name, set()))]
    assert not cycles, cycles
