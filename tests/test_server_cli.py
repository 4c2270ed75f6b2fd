"""`pyengine serve` arguments: engine flags, gunicorn options, clear start-up errors."""
import argparse
import subprocess
import sys

import pytest
from server_process import find_checkpoint, server_env

from pyengine import serve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_give_one_gthread_worker_on_loopback():
    args = parse("/models/m")
    opts = serve.gunicorn_options(args)
    assert opts["bind"] == "127.0.0.1:8000"
    assert opts["workers"] == 1 and opts["worker_class"] == "webapp.worker.ServeWorker"
    assert opts["threads"] == 2 * 8 + 4
    assert opts["preload_app"] is False  # one engine per worker, built after the fork
    assert (args.api_key, args.served_model_name, args.max_body_bytes) == (None, None, 4 << 20)
    kwargs = serve.llm_kwargs(args)
    assert (kwargs["device"], kwargs["max_batch"], kwargs["cooperative_prefill"],
            kwargs["prefix_cache"]) == ("cpu", 8, True, True)


def test_flags_reach_engine_and_gunicorn():
    args = parse("m", "--host", "::1", "--port", "9001", "--max_batch", "2",
                 "--http_threads", "3", "--workers", "2", "--cooperative_prefill", "off",
                 "--prefix_cache", "off", "--kv_cache_bytes", str(3 << 29),
                 "--gpu_mem_ratio", "0.5", "--device", "cuda", "--max_model_len", "1024",
                 "--chunked_prefill_size", "64", "--threads", "1", "--api_key", "k",
                 "--max_body_bytes", "64k", "--access_log", "off")
    opts = serve.gunicorn_options(args)
    assert opts["bind"] == "[::1]:9001"
    assert (opts["threads"], opts["workers"], opts["accesslog"]) == (3, 2, None)
    kwargs = serve.llm_kwargs(args)
    assert kwargs["cooperative_prefill"] is False and kwargs["prefix_cache"] is False
    assert kwargs["kv_cache_bytes"] == 3 << 29
    assert (kwargs["max_batch"], kwargs["max_model_len"], kwargs["chunked_prefill_size"]) \
        == (2, 1024, 64)
    assert (kwargs["device"], kwargs["gpu_mem_ratio"], kwargs["num_threads"]) == ("cuda", 0.5, 1)
    assert (args.api_key, args.max_body_bytes) == ("k", 65536)


@pytest.mark.parametrize("text, value", [("4096", 4096), ("512M", 512 << 20), ("2g", 2 << 30),
                                         ("1KiB", 1024), ("3 GB", 3 << 30)])
def test_byte_size(text, value):
    assert serve.byte_size(text) == value


@pytest.mark.parametrize("argv", [["m", "--http_threads", "0"], ["m", "--prefix_cache", "yes"],
                                  ["m", "--max_body_bytes", "lots"], ["m", "--port", "http"],
                                  ["m", "--workers", "-1"]])
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_missing_model_dir_is_reported_before_gunicorn_starts(tmp_path, capsys):
    assert serve.main([str(tmp_path / "nope")]) == 2
    assert "model directory not found" in capsys.readouterr().err
    assert serve.main([str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_no_model_uses_the_embedded_one_or_says_what_to_do(capsys):
    from pyengine.cli_args import check_model_dir
    from pyengine.llm import default_model_path
    problem = check_model_dir(None)
    if default_model_path() is None:
        assert "pyengine serve MODEL_DIR" in problem
    else:
        assert problem is None


def test_a_checkpoint_that_fails_to_load_stops_the_server(tmp_path):
    # A valid config.json passes the checks before gunicorn; the missing tokenizer fails the load.
    config = find_checkpoint() / "config.json"
    (tmp_path / "config.json").write_text(config.read_text())
    proc = subprocess.run([sys.executable, "-m", "pyengine.serve", str(tmp_path), "--port", "0"],
                          check=False, capture_output=True, text=True, timeout=60,
                          env=server_env(), cwd=tmp_path)
    assert proc.returncode == 3  # gunicorn's "worker failed to boot": no restart loop
    assert "model failed to load" in proc.stderr
    assert "tokenizer.json: file not found" in proc.stderr  # the loader's own message
