"""`pyengine stress`: the first users' cycles, with a fixed seed, a cycle count and a time bound.

First, solo references: each short chat prompt alone (its T = 0 output, first-token time and
speed) and one cache-busted long prompt alone (its prefill time P = its first-token time).
Then each cycle runs, with a fresh long prompt (a new nonce, so no prefix cache holds it) and
seeded choices of short prompts and insertion points:
  insert_one    a short request sent at a random point (20-60 % of P) of a long prefill
  insert_two    two short requests sent at once at such a point
  cancel        a long request cancelled at such a point, then a short request sent
  together      --concurrency short requests at once vs the same prompts alone
Every short output is compared with its solo output (T = 0: they must be equal; a difference is
a wrong answer). Reported: p50 / p95 of each ratio and time over the cycles, errors, wrong answers.
"""

from __future__ import annotations

import random
import time

from .client import ChatRequest, Client, EndpointError, StreamResult
from .metrics import combined_tok_s, percentile, stream_metrics
from .progress import progress
from .texts import chars_per_token, chat_prompts, long_messages

LONG_MAX_TOKENS = 8
DEFAULT_LONG_TOKENS = 54000
RATIOS = {
    "insert_ttft_over_prefill": "insert one: short TTFT / solo long prefill",
    "insert_decode_over_solo": "insert one: short decode tok/s / solo",
    "insert_two_ttft_over_prefill": "insert two: short TTFT / solo long prefill",
    "long_prefill_over_solo": "long prefill with inserts / solo",
    "cancel_ttft_over_prefill": "after cancel: short TTFT / solo long prefill",
    "together_combined_over_solo": "c together: combined tok/s / solo tok/s",
}
TIMES = {
    "insert_ttft_s": "insert one / two: short TTFT (s)",
    "long_prefill_s": "long prefill with inserts (s)",
    "cancel_ttft_s": "after cancel: short TTFT (s)",
    "together_combined_tok_s": "c together: combined tok/s",
}


class Stress:
    def __init__(self, client: Client, args):
        self.client, self.args = client, args
        self.pool = [row["messages"] for row in chat_prompts()]
        self.thinking = None if args.thinking is None else args.thinking == "on"
        self.values: dict[str, list[float]] = {k: [] for k in (*RATIOS, *TIMES)}
        self.errors: list[str] = []
        self.wrong: list[dict] = []
        self.requests = 0

    # ---- requests ----
    def short(self, j: int) -> ChatRequest:
        return ChatRequest(self.pool[j], max_tokens=self.args.max_tokens, temperature=0.0, seed=self.args.seed,
                           ignore_eos=True, thinking=self.thinking)  # fmt: skip

    def long(self, rng: random.Random, max_tokens: int = LONG_MAX_TOKENS) -> ChatRequest:
        return ChatRequest(long_messages(self.long_tokens, self.cpt, rng), max_tokens=max_tokens,
                           temperature=0.0, seed=self.args.seed, thinking=self.thinking)  # fmt: skip

    def check(self, r: StreamResult, j: int | None = None, cancelled_ok: bool = False) -> StreamResult:
        """Count errors and, for a short request j, wrong answers against its solo output."""
        self.requests += 1
        if r.error or (r.cancelled and not cancelled_ok):
            self.errors.append(r.error or "cancelled without being asked to")
        elif j is not None and r.output != self.solo[j].output:
            self.wrong.append({"prompt": j, "solo": self.solo[j].output[:200], "got": r.output[:200]})
        return r

    # ---- references ----
    def calibrate(self, rng: random.Random) -> dict:
        self.cpt = chars_per_token(self.client, self.args.seed)
        limit = self.client.max_model_len
        auto = min(DEFAULT_LONG_TOKENS, int(0.9 * limit) - LONG_MAX_TOKENS) if limit else DEFAULT_LONG_TOKENS
        self.long_tokens = self.args.long_tokens or auto
        with progress(len(self.pool) + 1, "stress: solo references", "req") as bar:
            self.solo = []
            for j in range(len(self.pool)):
                self.solo.append(self.client.run(self.short(j)))
                bar.update(1)
            long_solo = self.client.run(self.long(rng, max_tokens=1))
            bar.update(1)
        for r in (*self.solo, long_solo):
            if not r.ok or r.ttft is None:
                raise EndpointError(f"a solo reference request failed: {r.error or 'no output'}")
        self.prefill_s = long_solo.ttft
        return {
            "long_prompt_tokens": long_solo.prompt_tokens, "long_prefill_s": self.prefill_s,
            "short": [stream_metrics(r) for r in self.solo],
        }  # fmt: skip

    # ---- one cycle ----
    def cycle(self, rng: random.Random) -> dict:
        out = {}
        c = self.client
        j = rng.randrange(len(self.pool))
        long = c.start(self.long(rng))
        time.sleep(rng.uniform(0.2, 0.6) * self.prefill_s)
        s = self.check(c.run(self.short(j)), j)
        lr = self.check(long.wait())
        self._add(out, "insert_ttft_s", s.ttft)
        self._add(out, "insert_ttft_over_prefill", _div(s.ttft, self.prefill_s))
        self._add(out, "insert_decode_over_solo", _div(_decode(s), _decode(self.solo[j])))
        self._add(out, "long_prefill_s", lr.ttft)
        self._add(out, "long_prefill_over_solo", _div(lr.ttft, self.prefill_s))

        pair = [rng.randrange(len(self.pool)) for _ in range(2)]
        long = c.start(self.long(rng))
        time.sleep(rng.uniform(0.2, 0.6) * self.prefill_s)
        two = [self.check(r, k) for r, k in zip(c.run_together([self.short(k) for k in pair]), pair)]
        lr = self.check(long.wait())
        for r in two:
            self._add(out, "insert_ttft_s", r.ttft)
            self._add(out, "insert_two_ttft_over_prefill", _div(r.ttft, self.prefill_s))
        self._add(out, "long_prefill_s", lr.ttft)
        self._add(out, "long_prefill_over_solo", _div(lr.ttft, self.prefill_s))

        j = rng.randrange(len(self.pool))
        long = c.start(self.long(rng, max_tokens=self.args.max_tokens))
        time.sleep(rng.uniform(0.2, 0.6) * self.prefill_s)
        long.cancel()
        s = self.check(c.run(self.short(j)), j)
        self.check(long.wait(), cancelled_ok=True)
        self._add(out, "cancel_ttft_s", s.ttft)
        self._add(out, "cancel_ttft_over_prefill", _div(s.ttft, self.prefill_s))

        group = [rng.randrange(len(self.pool)) for _ in range(self.args.concurrency)]
        done = [self.check(r, k) for r, k in zip(c.run_together([self.short(k) for k in group]), group)]
        together = combined_tok_s(done)
        alone = _mean([stream_metrics(self.solo[k])["tok_s"] for k in group])
        self._add(out, "together_combined_tok_s", together)
        self._add(out, "together_combined_over_solo", _div(together, alone))
        return out

    def _add(self, out: dict, name: str, value: float | None) -> None:
        if value is not None:
            self.values[name].append(value)
            out.setdefault(name, []).append(value)


def run_stress(client: Client, args) -> dict:
    st = Stress(client, args)
    t0 = time.perf_counter()
    solo = st.calibrate(random.Random(args.seed))
    cycles = []
    with progress(args.cycles, "stress", "cycle") as bar:
        for i in range(args.cycles):
            if time.perf_counter() - t0 > args.max_time_s:
                break
            cycles.append(st.cycle(random.Random(args.seed * 1_000_003 + i)))
            bar.update(1)
            bar.set_postfix_str(f"errors {len(st.errors)} wrong {len(st.wrong)}")
    return {
        "solo": solo, "long_tokens_asked": st.long_tokens, "cycles_done": len(cycles),
        "elapsed_s": time.perf_counter() - t0, "requests": st.requests,
        "errors": len(st.errors), "error_messages": sorted(set(st.errors)),
        "wrong_answers": len(st.wrong), "wrong": st.wrong[:20],
        "ratios": {k: _dist(st.values[k], label) for k, label in RATIOS.items()},
        "times": {k: _dist(st.values[k], label) for k, label in TIMES.items()},
        "cycles": cycles,
    }  # fmt: skip


def _dist(values: list[float], label: str) -> dict:
    return {"label": label, "p50": percentile(values, 50), "p95": percentile(values, 95), "values": values}


def _div(a, b):
    return a / b if a is not None and b else None


def _decode(r: StreamResult):
    return stream_metrics(r)["decode_tok_s"]


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def table(result: dict) -> str:
    solo = result["solo"]
    head = (f"{result['cycles_done']} cycles in {result['elapsed_s']:.1f} s; long prompt "
            f"{solo['long_prompt_tokens']} tokens, solo prefill {solo['long_prefill_s']:.3f} s")
    rows = [head, f"{'':<48} {'p50':>9} {'p95':>9}"]
    for group in ("ratios", "times"):
        for d in result[group].values():
            rows.append(f"{d['label']:<48} {_fmt(d['p50']):>9} {_fmt(d['p95']):>9}")
    rows.append(f"requests {result['requests']}, errors {result['errors']}, wrong answers {result['wrong_answers']}")
    return "\n".join(rows)


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"
