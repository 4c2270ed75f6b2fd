"""The default model measured with pyengine's own engine on the CPU (the model card's figures).

  perplexity  exp(mean NLL) on the held-out code and prose of the corpus (.train/corpus/heldout),
              tokenized as in training (documents joined by <|endoftext|>), cut into consecutive
              windows of --window tokens evenly spaced over each whole stream (all of prose,
              64 windows = 17% of code by default); every window is a fresh sequence through
              llm.prompt_logits and scores its window-1 next tokens. For code it also reports the
              figure without the windows touching the 4 generated codec tables (encodings/*.py).
  arithmetic  the 200 held-out chat questions (data/heldout_arith.json, never trained on), greedy,
              thinking as each question says, batched through llm.generate; a reply is right when
              the last integer after </think> equals the answer (as evaluate.py counts).
  transcript  a fixed set of single-turn chats (arithmetic, Python functions, Wikipedia topics -
              one trained on, one held out - and small talk), greedy, printed and saved.

Prints a JSON summary (and writes it with the transcript under --out).
  PYENGINE_LIBRARY=... PYTHONPATH=. python3 tools/default_model/eval_engine.py [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
EOT_ID = 0  # <|endoftext|>, as data.py joins documents

# (label, thinking, question). Fixed before looking at any reply; greedy, so reproducible.
TRANSCRIPT = [
    ("arithmetic, thinking", True, "What is 478 + 256?"),
    ("arithmetic, no thinking", False, "Compute 903 - 468."),
    ("Python function", False, "Write a Python function that checks whether a number is prime."),
    (
        "Python function, thinking",
        True,
        "Can you give me a Python function that reverses the words in a sentence?",
    ),
    ("Wikipedia topic (in training)", False, "What is photosynthesis?"),
    ("Wikipedia topic (held out)", False, "Who was Abel Tasman?"),
    ("small talk", False, "Hi! How are you today?"),
    ("small talk", False, "What can you do?"),
]


def heldout_stream(
    corpus: Path, source: str, tokenizer_file: Path
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, is_table) of a held-out split; is_table marks the tokens of generated codec tables
    (encodings/*.py: 4 of the 40 held-out code files, 21% of its tokens, near-copies of training files)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    with lzma.open(corpus / "heldout" / f"{source}.jsonl.xz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    names = [""] * len(texts)
    if source == "code":
        names = json.loads((corpus / "manifest.json").read_text())["code_heldout_files"]
        assert len(names) == len(texts), (len(names), len(texts))
    ids: list[int] = []
    table: list[bool] = []
    for name, enc in zip(names, tok.encode_batch(texts, add_special_tokens=False)):
        ids += enc.ids + [EOT_ID]
        table += [name.startswith("encodings/")] * (len(enc.ids) + 1)
    return np.asarray(ids, dtype=np.int64), np.asarray(table, dtype=bool)


def perplexity(llm, stream: np.ndarray, table: np.ndarray, window: int, max_tokens: int) -> dict:
    """Windows evenly spaced over the whole stream (all of it when max_tokens allows)."""
    n_all = len(stream) // window
    n_windows = min(n_all, max(1, max_tokens // window))
    if n_windows == n_all:
        offsets = [w * window for w in range(n_all)]
    else:
        offsets = [int(o) for o in np.linspace(0, len(stream) - window, n_windows)]
    nlls, tables, t0 = [], [], time.time()
    for o in offsets:
        ids = stream[o : o + window]
        logits = llm.prompt_logits([int(i) for i in ids])[:-1].astype(np.float64)
        m = logits.max(-1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
        nlls.append(float((logz - logits[np.arange(window - 1), ids[1:]]).sum()))
        tables.append(bool(table[o : o + window].any()))
    seconds = time.time() - t0
    result = {
        "ppl": round(math.exp(sum(nlls) / (len(nlls) * (window - 1))), 3),
        "scored_tokens": len(nlls) * (window - 1),
        "windows": len(nlls),
        "window": window,
        "stream_tokens": len(stream),
        "seconds": round(seconds, 1),
    }
    if any(tables):
        rest = [x for x, t in zip(nlls, tables) if not t]
        result["ppl_without_codec_tables"] = round(
            math.exp(sum(rest) / (len(rest) * (window - 1))), 3
        )
        result["windows_in_codec_tables"] = sum(tables)
    return result


def last_integer(text: str):
    found = re.findall(r"-?\d+", text.split("</think>")[-1].replace(",", ""))
    return int(found[-1]) if found else None


def arithmetic(llm, questions: list[dict], max_tokens: int) -> dict:
    from pyengine import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompts = [
        llm.apply_chat_template(q["messages"], enable_thinking=q.get("enable_thinking", True))
        for q in questions
    ]
    t0 = time.time()
    outs = llm.generate(prompts, sp)
    seconds = time.time() - t0
    right, wrong, truncated = 0, [], 0
    for q, o in zip(questions, outs):
        ok = last_integer(o.text) == q["answer"]
        right += ok
        truncated += o.finish_reason == "length"
        if not ok:
            wrong.append(
                {
                    "id": q["id"],
                    "question": q["messages"][-1]["content"],
                    "answer": q["answer"],
                    "reply": o.text,
                }
            )
    n_tokens = sum(len(o.token_ids) for o in outs)
    return {
        "accuracy": right / len(questions),
        "correct": right,
        "n": len(questions),
        "thinking": sum(bool(q.get("enable_thinking", True)) for q in questions),
        "hit_max_tokens": truncated,
        "generated_tokens": n_tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(n_tokens / seconds, 1),
        "wrong": wrong,
    }


def transcript(llm, max_tokens: int) -> list[dict]:
    from pyengine import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    turns = []
    for label, thinking, question in TRANSCRIPT:
        out = llm.chat(
            [{"role": "user", "content": question}],
            sp,
            chat_template_kwargs={"enable_thinking": thinking},
        )[0]
        turns.append(
            {
                "label": label,
                "enable_thinking": thinking,
                "user": question,
                "assistant": out.text,
                "finish_reason": out.finish_reason,
                "tokens": len(out.token_ids),
            }
        )
    return turns


def transcript_markdown(turns: list[dict], command: str) -> str:
    lines = [
        "# Sample chat transcript (greedy, pyengine on the CPU)",
        "",
        (
            f"Produced by `{command}`; each chat is a fresh single-turn conversation; replies verbatim "
            "(a thinking reply starts inside the `<think>` block the template opens)."
        ),
        "",
    ]
    for t in turns:
        lines += [
            f"## {t['label']} (enable_thinking={t['enable_thinking']})",
            "",
            f"**User:** {t['user']}",
            "",
            "**Assistant:**",
            "",
            "````text",
            t["assistant"],
            "````",
            "",
        ]
        if t["finish_reason"] != "stop":
            lines += [f"(stopped by {t['finish_reason']} after {t['tokens']} tokens)", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="model dir (default: the embedded default model)")
    ap.add_argument("--corpus", type=Path, default=REPO / ".train" / "corpus")
    ap.add_argument("--questions", type=Path, default=HERE / "data" / "heldout_arith.json")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument(
        "--code-tokens",
        type=int,
        default=32768,
        help="at most this many held-out code tokens (of 192K)",
    )
    ap.add_argument(
        "--prose-tokens", type=int, default=1 << 20, help="at most this many (default: all 45.6K)"
    )
    ap.add_argument("--n-arith", type=int, default=200)
    ap.add_argument(
        "--arith-max-tokens", type=int, default=224, help="the longest right reply is 165 tokens"
    )
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="engine CPU threads (0: all cores)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: ppl,arith,chat")
    ap.add_argument(
        "--out", type=Path, default=HERE / "card", help="writes eval_engine.json and transcript.md"
    )
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    command = (
        "python3 tools/default_model/eval_engine.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )

    from pyengine import LLM

    t_start = time.time()
    llm = LLM(args.model, max_batch=args.max_batch, max_model_len=4096, num_threads=args.threads)
    summary: dict = {
        "command": command,
        "model": llm.model_path,
        "cpu_cores": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    tokenizer_file = Path(llm.model_path) / "tokenizer.json"
    if "ppl" not in skip:
        for source, cap in (("code", args.code_tokens), ("prose", args.prose_tokens)):
            stream, table = heldout_stream(args.corpus, source, tokenizer_file)
            summary[f"{source}_ppl"] = perplexity(llm, stream, table, args.window, cap)
            print(f"{source}: {json.dumps(summary[f'{source}_ppl'])}", file=sys.stderr, flush=True)
    if "arith" not in skip:
        questions = json.loads(args.questions.read_text())[: args.n_arith]
        summary["arith"] = arithmetic(llm, questions, args.arith_max_tokens)
        print(
            f"arith: {summary['arith']['correct']}/{summary['arith']['n']}",
            file=sys.stderr,
            flush=True,
        )
    if "chat" not in skip:
        turns = transcript(llm, 320)
        summary["transcript"] = turns
        md = transcript_markdown(turns, command)
        print(md, file=sys.stderr)
    llm.close()
    summary["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    summary["seconds"] = round(time.time() - t_start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eval_engine.json").write_text(json.dumps(summary, indent=1) + "\n")
    if "chat" not in skip:
        (args.out / "transcript.md").write_text(md)
    brief = {k: v for k, v in summary.items() if k != "transcript"}
    if "arith" in brief:
        brief["arith"] = {k: v for k, v in brief["arith"].items() if k != "wrong"}
        brief["arith"]["wrong_ids"] = [w["id"] for w in summary["arith"]["wrong"]]
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
