"""`pyengine stress` against `pyengine serve` and against an independent OpenAI stub; a stub that
corrupts answers under concurrency shows that wrong answers are counted."""

from openai_stub import StubProcess
from server_process import browser_server
from tools_helpers import load_and_keep, outputs, read_json, run_cli

from pyengine.tools import commands

# Per cycle: long + 1 short, long + 2 shorts, long (cancelled) + 1 short, --concurrency (2) shorts.
REQUESTS_PER_CYCLE = 9


def test_stress_against_pyengine_serve(tmp_path):
    server = browser_server()
    out, png = outputs(tmp_path, "tools_stress_pyengine")
    proc = run_cli("stress", "--base_url", server.url + "/v1", "--cycles", "1", "--max_tokens", "8",
                   "--long_tokens", "1200", "--out", out, "--plot", png)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = load_and_keep(out, png)
    assert (result["cycles_done"], result["requests"]) == (1, REQUESTS_PER_CYCLE)
    assert result["errors"] == 0, result["error_messages"]
    assert result["wrong_answers"] == 0, result["wrong"]  # T = 0 under load equals T = 0 alone
    assert 900 < result["solo"]["long_prompt_tokens"] < 1500  # sized from the measured chars/token
    for name, dist in result["ratios"].items():
        assert dist["values"] and dist["p50"] > 0, name
    assert len(result["ratios"]["insert_two_ttft_over_prefill"]["values"]) == 2
    # The short request inserted into the long prefill waits for chunks, never the whole prompt
    # (cooperative prefill): its TTFT is a fraction of a solo long prefill.
    assert result["ratios"]["insert_ttft_over_prefill"]["p50"] < 0.9
    assert server.wait_idle()["running"] == 0  # the cancelled long request is gone


def test_stress_against_an_independent_server(tmp_path):
    out = str(tmp_path / "stress_stub.json")
    with StubProcess({"token_delay_s": 0.002, "prefill_s_per_kchar": 0.3}, tmp_path) as stub:
        code = commands.main(["stress", "--base_url", stub.base_url, "--cycles", "2", "--max_tokens", "6",
                              "--long_tokens", "400", "--out", out])  # fmt: skip
    assert code == 0
    result = read_json(out)
    assert (result["cycles_done"], result["requests"]) == (2, 2 * REQUESTS_PER_CYCLE)
    assert (result["errors"], result["wrong_answers"]) == (0, 0)
    assert result["target"]["model"] == "stub-model"
    # The stub serves every stream in parallel: a short request never waits for the long one.
    assert result["times"]["cancel_ttft_s"]["p95"] < 0.3
    assert result["ratios"]["insert_ttft_over_prefill"]["p95"] < 0.5


def test_stress_counts_wrong_answers(tmp_path):
    out = str(tmp_path / "stress_wrong.json")
    with StubProcess({"token_delay_s": 0.002, "prefill_s_per_kchar": 0.3, "corrupt_when_concurrent": True},
                     tmp_path) as stub:  # fmt: skip
        assert commands.main(["stress", "--base_url", stub.base_url, "--cycles", "1", "--max_tokens", "6",
                              "--long_tokens", "400", "--out", out]) == 0  # fmt: skip
    result = read_json(out)
    assert result["errors"] == 0
    # Each of the 6 short requests of a cycle runs beside another stream (a long prefill or its
    # partner), so all should differ from their solo runs; 4 allows for a late thread start.
    assert 4 <= result["wrong_answers"] <= 6
    assert all("WRONG" in w["got"] and "WRONG" not in w["solo"] for w in result["wrong"])


def test_stress_respects_its_time_bound(tmp_path):
    out = str(tmp_path / "stress_bound.json")
    with StubProcess({"prefill_s_per_kchar": 0.3}, tmp_path) as stub:
        assert commands.main(["stress", "--base_url", stub.base_url, "--cycles", "50", "--max_time_s", "0",
                              "--max_tokens", "4", "--long_tokens", "200", "--out", out]) == 0  # fmt: skip
    assert read_json(out)["cycles_done"] == 0


def test_stress_says_why_when_the_long_prompt_does_not_fit(tmp_path, capsys):
    server = browser_server()  # 8,192-token context
    code = commands.main(["stress", "--base_url", server.url + "/v1", "--cycles", "1", "--max_tokens", "4",
                          "--long_tokens", "20000"])  # fmt: skip
    assert code == 1
    assert "solo reference request failed: HTTP 400" in capsys.readouterr().err
