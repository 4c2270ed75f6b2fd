"""`pyengine eval`: a small capability check, scored per item, against any endpoint.

Items (JSONL, one per line; the shipped set is data/eval_small.jsonl):
  {"id", "type": "number", "messages": [...], "answer": 42}           the answer's last number
  {"id", "type": "choice", "question", "choices": [...], "answer": "B"} a letter (or the choice's text)
  {"id", "type": "code", "messages": [...], "tests": "def check(candidate): ...",
   "entry_point": "name" (optional)}                                   the reply's code passes check()
Optional per item: "thinking": true/false (chat_template_kwargs.enable_thinking; --thinking wins).
Greedy (T = 0). The answer is read from the reply's content, after any reasoning. Code is the
last fenced block (or the whole reply); the function checked is entry_point, else the last
top-level function the code defines; it runs in a subprocess with time and memory limits
(sandbox.py). Every item's reply, extraction and verdict is kept in the JSON.
"""

from __future__ import annotations

import ast
import re
from concurrent.futures import ThreadPoolExecutor

from .client import ChatRequest, Client
from .progress import progress
from .sandbox import run_python
from .texts import DATA, load_jsonl

TYPES = ("number", "choice", "code")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_LETTERS = "ABCDEFGH"


def load_items(path: str | None, limit: int | None) -> list[dict]:
    items = load_jsonl(path or DATA / "eval_small.jsonl")
    for k, item in enumerate(items):
        if item.get("type") not in TYPES:
            raise ValueError(f"item {k} ({item.get('id')}): type must be one of {TYPES}")
        if "answer" not in item and item["type"] != "code":
            raise ValueError(f"item {k} ({item.get('id')}): no answer")
        if item["type"] == "code" and "tests" not in item:
            raise ValueError(f"item {k} ({item.get('id')}): a code item needs tests")
    if limit is not None:
        kept, seen = [], {}
        for item in items:
            seen[item["type"]] = seen.get(item["type"], 0) + 1
            if seen[item["type"]] <= limit:
                kept.append(item)
        items = kept
    return items


def messages_of(item: dict) -> list[dict]:
    if item["type"] != "choice":
        return item["messages"]
    lines = [item["question"]] + [f"{_LETTERS[i]}) {c}" for i, c in enumerate(item["choices"])]
    lines.append("Answer with the letter of the correct choice.")
    return [{"role": "user", "content": "\n".join(lines)}]


# ---- extraction ----
def final_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def chosen_letter(text: str, choices: list[str]) -> str | None:
    letters = _LETTERS[: len(choices)]
    t = text.strip()
    # A leading letter counts when punctuated ("B", "(B)", "B)", "B." ...), not as the article "A".
    m = re.match(rf"^\(?([{letters}])(?:[\).:]|$)", t) or re.search(
        rf"(?i:answer)(?: is)?[:\s]*\(?([{letters}])\b", t)  # fmt: skip
    if m:
        return m.group(1).upper()
    named = [i for i, c in enumerate(choices) if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", t)]
    return letters[named[0]] if len(named) == 1 else None


def code_of(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def entry_point(code: str, asked: str | None) -> str | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    if asked:
        return asked if asked in names else None
    return names[-1] if names else None


# ---- scoring ----
def score(item: dict, content: str, timeout_s: float, memory_mb: int) -> dict:
    kind = item["type"]
    if kind == "number":
        got = final_number(content)
        return {"extracted": got, "correct": got is not None and abs(got - float(item["answer"])) < 1e-6}
    if kind == "choice":
        got = chosen_letter(content, item["choices"])
        return {"extracted": got, "correct": got == str(item["answer"]).upper()}
    code = code_of(content)
    name = entry_point(code, item.get("entry_point"))
    if name is None:
        return {"extracted": None, "correct": False, "detail": "no function (or a syntax error) in the reply"}
    run = run_python(f"{code}\n\n{item['tests']}\n\ncheck({name})\n", timeout_s, memory_mb)
    return {"extracted": name, "correct": run.passed, "status": run.status, "detail": run.detail}


def _one(client: Client, item: dict, args) -> dict:
    thinking = item.get("thinking") if args.thinking is None else args.thinking == "on"
    r = client.run(ChatRequest(messages_of(item), max_tokens=args.max_tokens, temperature=0.0, seed=args.seed,
                               thinking=thinking))  # fmt: skip
    row = {"id": item.get("id"), "type": item["type"], "expected": item.get("answer"), "content": r.content,
           "reasoning": r.reasoning, "ttft_s": r.ttft, "completion_tokens": r.n_tokens,
           "finish_reason": r.finish_reason, "error": r.error}  # fmt: skip
    if r.error:
        return {**row, "extracted": None, "correct": False}
    return {**row, **score(item, r.content, args.timeout_s, args.memory_mb)}


def run_eval(client: Client, items: list[dict], args) -> dict:
    rows: list[dict | None] = [None] * len(items)
    with progress(len(items), "eval", "item") as bar, ThreadPoolExecutor(args.concurrency) as pool:
        futures = {pool.submit(_one, client, item, args): k for k, item in enumerate(items)}
        correct = 0
        for fut, k in futures.items():
            rows[k] = fut.result()
            correct += rows[k]["correct"]
            bar.update(1)
            bar.set_postfix_str(f"correct {correct}")
    by_type = {}
    for t in TYPES:
        mine = [r for r in rows if r["type"] == t]
        if mine:
            n_ok = sum(r["correct"] for r in mine)
            by_type[t] = {"items": len(mine), "correct": n_ok, "accuracy": n_ok / len(mine),
                          "errors": sum(r["error"] is not None for r in mine)}  # fmt: skip
    total = sum(r["correct"] for r in rows)
    return {"by_type": by_type, "correct": total, "items": len(rows), "accuracy": total / len(rows) if rows else None,
            "errors": sum(r["error"] is not None for r in rows), "results": rows}  # fmt: skip


def table(result: dict) -> str:
    rows = ["type     correct  items  accuracy  errors"]
    for t, d in result["by_type"].items():
        rows.append(f"{t:<8} {d['correct']:>7}  {d['items']:>5}  {d['accuracy'] * 100:>7.1f}%  {d['errors']:>6}")
    rows.append(f"{'all':<8} {result['correct']:>7}  {result['items']:>5}  "
                f"{(result['accuracy'] or 0) * 100:>7.1f}%  {result['errors']:>6}")  # fmt: skip
    return "\n".join(rows)
