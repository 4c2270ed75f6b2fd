"""`pyengine kv-depth`: an A/B of two `pyengine serve` configurations (fp16 vs int8 KV cache),
and in-process configurations from engine flags."""
from types import SimpleNamespace

import pytest
from server_process import get_server
from tools_helpers import load_and_keep, outputs, read_json, run_cli

from pyengine.tools import commands, kv_depth

BUDGET = ["--max_tokens", "8", "--runs", "1", "--warmups", "1", "--depths", "300,1200", "--turns", "3",
          "--session_tokens", "1200"]  # fmt: skip


def _kv_server(dtype: str):
    return get_server(f"kv_{dtype}", "--kv_cache_dtype", dtype, "--max_model_len", "4096", "--threads", "1",
                      embedded_model=True)  # fmt: skip


def test_kv_depth_ab_of_two_servers(tmp_path):
    a, b = _kv_server("fp16"), _kv_server("int8")
    out, png = outputs(tmp_path, "tools_kv_depth_pyengine")
    proc = run_cli("kv-depth", "--base_url", a.url + "/v1", "--base_url_b", b.url + "/v1", "--label", "fp16 KV",
                   "--label", "int8 KV", *BUDGET, "--out", out, "--plot", png)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = load_and_keep(out, png)
    assert [c["label"] for c in result["configs"]] == ["fp16 KV", "int8 KV"]
    for cfg in result["configs"]:
        assert cfg["short"]["decode_tok_s"] > 0 and len(cfg["short"]["runs"]) == 1
        for probe, asked in zip(cfg["probes"], (300, 1200)):
            assert 0.75 * asked < probe["prompt_tokens"] < 1.25 * asked, probe
            assert probe["cached_tokens"] < 16  # cache-busted: not one page of it was cached
            assert probe["prefill_tok_s"] > 0 and probe["completion_tokens"] == 8
        turns = cfg["session"]
        assert [t["turn"] for t in turns] == [1, 2, 3]
        depth = [t["prompt_tokens"] for t in turns]
        assert depth[0] < depth[1] < depth[2] and 0.85 * 1200 < depth[2] < 1.15 * 1200, depth
        # Each follow-up turn reuses the conversation so far from the prefix cache (GDN snapshots).
        assert all(t["cached_tokens"] >= 0.5 * prev for t, prev in zip(turns[1:], depth))
        assert all(t["ttft_s"] > 0 and t["decode_tok_s"] > 0 for t in turns)


def test_kv_depth_in_process_configurations(tmp_path):
    out = str(tmp_path / "kv_inprocess.json")
    code = commands.main(["kv-depth", "--config", "--kv_cache_dtype fp16 --threads 1", "--config",
                          "--kv_cache_dtype fp4 --threads 1 --max_model_len 2048", "--max_tokens", "4", "--runs",
                          "1", "--warmups", "0", "--depths", "200", "--turns", "2", "--session_tokens", "400",
                          "--out", out])  # fmt: skip
    assert code == 0
    configs = read_json(out)["configs"]
    assert [c["label"] for c in configs] == ["in-process --kv_cache_dtype fp16 --threads 1",
                                             "in-process --kv_cache_dtype fp4 --threads 1 --max_model_len 2048"]
    assert [c["target"]["max_model_len"] for c in configs] == [8192, 2048]  # the flags reached the engine
    assert all(len(c["session"]) == 2 and c["probes"][0]["prompt_tokens"] > 100 for c in configs)


@pytest.mark.parametrize("kw, problem", [
    ({"base_url": "http://a/v1", "config": ["--threads 1"]}, "not both"),
    ({"base_url_b": "http://b/v1"}, "needs --base_url"),
    ({"config": ["", "", ""]}, "at most two"),
    ({"base_url": "http://a/v1", "label": ["a", "b"]}, "2 labels for 1"),
])  # fmt: skip
def test_kv_depth_configuration_errors(kw, problem):
    args = SimpleNamespace(**{"base_url": None, "base_url_b": None, "config": None, "label": None, **kw})
    assert problem in kv_depth.targets(args)
