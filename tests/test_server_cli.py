"""`pyengine serve` arguments: engine flags, gunicorn options, clear start-up errors."""
import argparse

import pytest

from pyengine import serve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_give_one_gthread_worker_on_loopback():
    args = parse("/models/m")
    opts = serve.gunicorn_options(args)
    assert opts["bind"] == "127.0.0.1:8000"
    assert opts["workers"] == 1 and opts["worker_class"] == "gthread"
    assert opts["threads"] == 2 * 8 + 4
    assert opts["preload_app"] is False  # one engine per worker, built after the fork
    assert serve.engine_kwargs(args) == {
        "device": "cpu", "max_batch": 8, "max_model_len": 8192, "chunked_prefill_size": 512,
        "cooperative_prefill": True, "prefix_cache": True, "kv_cache_bytes": None,
        "gpu_mem_ratio": 0.9}


def test_flags_reach_engine_and_gunicorn():
    args = parse("m", "--host", "::1", "--port", "9001", "--max_batch", "2", "--threads", "3",
                 "--workers", "2", "--cooperative_prefill", "off", "--prefix_cache", "off",
                 "--kv_cache_bytes", "1.5G", "--gpu_mem_ratio", "0.5", "--device", "cuda",
                 "--max_model_len", "1024", "--chunked_prefill_size", "64",
                 "--api_key", "k", "--max_body_bytes", "64k", "--access_log", "off")
    opts = serve.gunicorn_options(args)
    assert opts["bind"] == "[::1]:9001"
    assert (opts["threads"], opts["workers"], opts["accesslog"]) == (3, 2, None)
    kwargs = serve.engine_kwargs(args)
    assert kwargs["cooperative_prefill"] is False and kwargs["prefix_cache"] is False
    assert kwargs["kv_cache_bytes"] == 3 * (1 << 29)
    assert (kwargs["max_batch"], kwargs["max_model_len"], kwargs["chunked_prefill_size"]) \
        == (2, 1024, 64)
    assert (kwargs["device"], kwargs["gpu_mem_ratio"]) == ("cuda", 0.5)
    assert (args.api_key, args.max_body_bytes) == ("k", 65536)


@pytest.mark.parametrize("text, value", [("4096", 4096), ("512M", 512 << 20), ("2g", 2 << 30),
                                         ("1KiB", 1024), ("3 GB", 3 << 30)])
def test_byte_size(text, value):
    assert serve.byte_size(text) == value


@pytest.mark.parametrize("argv", [["m", "--max_batch", "0"], ["m", "--prefix_cache", "yes"],
                                  ["m", "--kv_cache_bytes", "lots"],
                                  ["m", "--gpu_mem_ratio", "1.5"]])
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


def test_no_model_says_what_to_do(capsys):
    assert serve.main([]) == 2
    assert "pyengine serve MODEL_DIR" in capsys.readouterr().err
