"""`pyengine eval`: scoring rules, the code sandbox's limits, and a run against `pyengine serve`."""
import json

import pytest
from server_process import browser_server
from tools_helpers import load_and_keep, outputs, run_cli

from pyengine.tools import eval_harness as ev
from pyengine.tools.sandbox import run_python


def test_eval_against_pyengine_serve_on_the_shipped_set(tmp_path):
    server = browser_server()
    out, png = outputs(tmp_path, "tools_eval_pyengine")
    proc = run_cli("eval", "--base_url", server.url + "/v1", "--limit", "2", "--max_tokens", "200",
                   "--concurrency", "2", "--out", out, "--plot", png)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = load_and_keep(out, png)
    rows = {r["id"]: r for r in result["results"]}
    assert list(rows) == ["arith-0", "arith-1", "choice-0", "choice-1", "code-0", "code-1"]
    assert all(r["error"] is None and r["content"] for r in rows.values())
    # The default model's held-out arithmetic (thinking on) and its trained kinds of function: it
    # gets these right greedily (see its model card), so a miss here is a serving regression.
    assert (rows["arith-0"]["extracted"], rows["arith-1"]["extracted"]) == (550, -427)
    assert rows["arith-0"]["correct"] and rows["arith-1"]["correct"] and rows["arith-0"]["reasoning"]
    assert rows["code-0"]["correct"] and rows["code-1"]["correct"], (rows["code-0"], rows["code-1"])
    assert rows["code-0"]["status"] == "passed"
    assert result["by_type"]["number"] == {"items": 2, "correct": 2, "accuracy": 1.0, "errors": 0}
    assert result["items"] == 6 and result["correct"] == sum(r["correct"] for r in rows.values())


def test_shipped_set_is_well_formed():
    items = ev.load_items(None, None)
    assert {t: sum(i["type"] == t for i in items) for t in ev.TYPES} == {"number": 24, "choice": 10, "code": 12}
    assert len({i["id"] for i in items}) == len(items)
    for item in items:  # every choice answer names a choice; every code item's tests define check()
        if item["type"] == "choice":
            assert item["answer"] in "ABCD"[: len(item["choices"])]
        if item["type"] == "code":
            assert "def check(candidate)" in item["tests"]


@pytest.mark.parametrize("text, number", [
    ("So 478 + 256 = 734.\n\n734", 734), ("The result is -427.", -427), ("It is 1,250 in all", 1250),
    ("about 2.5 litres", 2.5), ("no digits here", None),
])  # fmt: skip
def test_final_number(text, number):
    assert ev.final_number(text) == number


@pytest.mark.parametrize("text, letter", [
    ("B", "B"), ("(C) Mars", "C"), ("D. 29", "D"), ("The answer is B.", "B"), ("Answer: (A)", "A"),
    ("Mars is the red one.", "C"), ("A planet like Venus or Mars", None), ("I am not sure.", None),
    ("The answer is a guess", None),
])  # fmt: skip
def test_chosen_letter(text, letter):
    assert ev.chosen_letter(text, ["Venus", "Jupiter", "Mars", "Saturn"]) == letter


def test_code_extraction_and_entry_point():
    reply = "Here:\n\n```python\ndef helper(x):\n    return x\n\ndef rev(s):\n    return s[::-1]\n```\nDone."
    code = ev.code_of(reply)
    assert code.startswith("def helper") and ev.entry_point(code, None) == "rev"
    assert ev.entry_point(code, "helper") == "helper" and ev.entry_point(code, "missing") is None
    assert ev.entry_point("def broken(:\n", None) is None


def test_code_items_are_scored_by_running_their_tests():
    item = {"type": "code", "tests": "def check(candidate):\n    assert candidate('ab') == 'ba'\n"}
    good = ev.score(item, "```python\ndef rev(s):\n    return s[::-1]\n```", 10, 512)
    bad = ev.score(item, "```python\ndef rev(s):\n    return s\n```", 10, 512)
    assert good["correct"] and not bad["correct"] and "AssertionError" in bad["detail"]


def test_sandbox_limits_time_memory_and_files():
    assert run_python("assert sum(range(10)) == 45").status == "passed"
    assert run_python("raise SystemExit(3)").status == "failed"
    slow = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert slow.status == "timeout" and not slow.passed
    hog = run_python("block = bytearray(2 << 30)\n", memory_mb=256)
    assert hog.status == "failed" and "MemoryError" in hog.detail
    big = run_python("open('f', 'w').write('x' * (4 << 20))\n")
    assert not big.passed and "File too large" in big.detail
    assert run_python("import os\nassert 'HOME' not in os.environ\n").passed  # an empty environment


def test_load_items_reports_a_bad_item(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "x", "type": "essay"}) + "\n")
    with pytest.raises(ValueError, match="type must be one of"):
        ev.load_items(str(path), None)
