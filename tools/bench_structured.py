"""Grammar overhead: decode tokens/s with a JSON schema against without, same prompt, same
number of tokens, at batch 1 and batch 8 (in-process LLM, CPU by default).

Also reported: the process's CPU time per generated token (engine threads, the dispatcher that
computes the masks, everything): on a shared machine wall-clock rates swing with the load, the
CPU time a token costs much less.

The schema is an array of at least 100 small objects, so no sample completes before max_tokens
and every token of the constrained run is sampled under a mask that the JSON parser computes
(keys, enums, integers, strings). The unconstrained run uses ignore_eos. Rounds alternate the two
modes; the median of each is reported.

    python3 tools/bench_structured.py [--model DIR] [--tokens 256] [--rounds 3]
"""
import argparse
import resource
import statistics
import time

from pyengine import LLM, SamplingParams, StructuredOutputsParams

SCHEMA = {
    "type": "array",
    "minItems": 100,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "role", "active"],
        "additionalProperties": False,
    },
}
PROMPT = [{"role": "user", "content": "List the users of the system as JSON."}]


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(llm: LLM, prompt: str, batch: int, tokens: int, constrained: bool, seed: int) -> tuple[float, float]:
    """(tokens/s, CPU ms per token) of one batch."""
    so = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = [SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed + i, ignore_eos=not constrained,
                             structured_outputs=so) for i in range(batch)]  # fmt: skip
    c0, t0 = cpu_seconds(), time.perf_counter()
    outs = llm.generate([prompt] * batch, params)
    dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
    n = sum(len(o.token_ids) for o in outs)
    if n != batch * tokens:
        raise RuntimeError(f"expected {batch * tokens} tokens, got {n} ({[o.finish_reason for o in outs]})")
    return n / dt, 1000 * dc / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=0, help="engine CPU threads (0: all cores)")
    args = ap.parse_args()
    with LLM(args.model, device=args.device, max_batch=8, max_model_len=2048, num_threads=args.threads) as llm:
        prompt = llm.apply_chat_template(PROMPT, enable_thinking=False)
        run(llm, prompt, 1, 16, True, 0)  # warm-up: compiles and builds llguidance's tokenizer
        for batch in (int(b) for b in args.batches.split(",")):
            res = {False: [], True: []}
            for r in range(args.rounds):
                for constrained in (False, True):
                    res[constrained].append(run(llm, prompt, batch, args.tokens, constrained, 1000 * r))
            rate = {k: statistics.median(x for x, _ in v) for k, v in res.items()}
            cpu = {k: statistics.median(c for _, c in v) for k, v in res.items()}
            print(f"batch {batch}: without grammar {rate[False]:.1f} tok/s, with JSON schema {rate[True]:.1f} tok/s "
                  f"({100 * (1 - rate[True] / rate[False]):+.1f} % slower); CPU per token {cpu[False]:.2f} / "
                  f"{cpu[True]:.2f} ms ({100 * (cpu[True] / cpu[False] - 1):+.1f} %); rounds (tok/s): "
                  f"{[round(x) for x, _ in res[False]]} / {[round(x) for x, _ in res[True]]}", flush=True)


if __name__ == "__main__":
    main()
