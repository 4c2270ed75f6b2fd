"""`pyengine bench` against `pyengine serve`, against an independent OpenAI-compatible stub whose
timing is known (so the client-side measurements can be checked), and in-process."""
import json

import pytest
from openai_stub import StubProcess
from server_process import browser_server
from tools_helpers import load_and_keep, outputs, read_json, run_cli

from pyengine.tools import commands
from pyengine.tools.texts import bench_prompts


def test_bench_against_pyengine_serve_writes_json_and_png(tmp_path):
    server = browser_server()
    out, png = outputs(tmp_path, "tools_bench_pyengine")
    proc = run_cli("bench", "--base_url", server.url + "/v1", "--max_tokens", "16", "--runs", "1",
                   "--out", out, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    # The server runs the embedded model with its own proposer (speculative_algorithm auto): the
    # acceptance comes from the responses' usage.
    assert "speculative acceptance per position: 1:" in proc.stdout
    result = load_and_keep(out, png)
    cells = {(c["kind"], c["concurrency"]): c for c in result["cells"]}
    assert set(cells) == {(k, c) for k in ("code", "math", "prose") for c in (1, 2)}
    for cell in cells.values():
        assert cell["errors"] == 0 and cell["streams"] == cell["concurrency"]
        assert cell["completion_tokens"] == 16  # ignore_eos reached the engine; usage counted them
        assert 0 < cell["ttft_s"] < 10 and 0 < cell["tpot_s"] < 1
        assert cell["itl_s"]["p50"] <= cell["itl_s"]["p95"] <= cell["itl_s"]["p99"]
    assert cells[("code", 2)]["combined_tok_s"] > cells[("code", 2)]["tok_s"]
    assert len(result["accept_per_position"]) >= 1 and 0.5 < result["accept_per_position"][0] <= 1.0
    assert result["target"]["model"] == "default_model" and result["target"]["max_model_len"] == 8192


STUB_TIMING = {"token_delay_s": 0.02, "prefill_s_per_kchar": 1.0, "accept": [0.9, 0.75, 0.61, 0.4]}


def test_bench_against_an_independent_server_measures_its_known_timing(tmp_path, capsys):
    out = str(tmp_path / "bench_stub.json")
    with StubProcess(STUB_TIMING, tmp_path) as stub:
        code = commands.main(["bench", "--base_url", stub.base_url, "--max_tokens", "12", "--runs", "2",
                              "--kinds", "code,prose", "--warmup", "0", "--out", out])  # fmt: skip
    assert code == 0
    assert "1:90.0% 2:75.0% 3:61.0% 4:40.0%" in capsys.readouterr().out
    result = read_json(out)
    assert result["target"] == {"endpoint": stub.base_url, "model": "stub-model", "max_model_len": None}
    assert result["accept_per_position"] == pytest.approx([0.9, 0.75, 0.61, 0.4])
    for cell in result["cells"]:
        # The stub sleeps 1 ms per prompt character before the first token, 20 ms between tokens.
        prefill = len(json.dumps(bench_prompts()[cell["kind"]])) / 1000
        assert prefill <= cell["ttft_s"] < prefill + 0.1, cell
        assert 0.020 <= cell["tpot_s"] < 0.030 and 0.020 <= cell["itl_s"]["p50"] < 0.030, cell
        assert cell["completion_tokens"] == 12 and cell["errors"] == 0
        if cell["concurrency"] == 2:  # the stub serves streams in parallel: twice the tokens
            assert 1.6 < cell["combined_tok_s"] / cell["tok_s"] < 2.2, cell


def test_bench_counts_chunks_when_a_server_reports_no_usage(tmp_path):
    out = str(tmp_path / "bench_nousage.json")
    with StubProcess({"usage": False}, tmp_path) as stub:
        assert commands.main(["bench", "--base_url", stub.base_url, "--max_tokens", "7", "--runs", "1",
                              "--concurrency", "1", "--kinds", "math", "--out", out]) == 0  # fmt: skip
    (cell,) = read_json(out)["cells"]
    assert cell["completion_tokens"] == 7 and cell["runs"][0][0]["prompt_tokens"] is None


def test_bench_in_process_on_the_embedded_model(tmp_path, capsys):
    out = str(tmp_path / "bench_inprocess.json")
    code = commands.main(["bench", "--max_tokens", "8", "--runs", "1", "--concurrency", "2", "--kinds", "code",
                          "--threads", "1", "--out", out])  # fmt: skip
    assert code == 0
    result = read_json(out)
    assert result["target"]["endpoint"].startswith("in-process:")
    for cell in result["cells"]:
        assert cell["errors"] == 0 and cell["completion_tokens"] == 8
        for run in cell["runs"]:
            assert all(s["prompt_tokens"] > 10 for s in run)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--bisect-metric", "tok_s"], "go together"),
    (["bench", "--bisect-metric", "speed", "--bisect-threshold", "1"], "unknown --bisect-metric"),
    (["bench", "--bisect_metric", "speed", "--bisect_threshold", "1"], "unknown --bisect-metric"),
])  # fmt: skip
def test_bench_refuses_half_or_unknown_bisect_flags(argv, message, capsys):
    assert commands.main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_commands_are_listed_and_documented():
    proc = run_cli("--help")
    assert proc.returncode == 0 and all(name in proc.stdout for name in commands.NAMES)
    proc = run_cli("stress", "--help")
    assert proc.returncode == 0 and "--cycles" in proc.stdout and "wrong answer" in proc.stdout
