"""Speculative decoding on the CPU, with the MTP proposer and with a DFlash draft model: token for
token what plain decoding gives at temperature 0 (MTP k = 1, 3, 5, DFlash blocks; one request, and
8 at once beside a long prompt that prefills in chunks; prefix cache on), drafts equal to
LLM.mtp_logits' argmax, lossless sampling at temperature 1 and at top_p 0.9 / temperature 0.7
(chi-square against spec off and against the exact distribution from prompt_logits), the
per-request switch, stats and options."""

import json
import os
import shutil

import numpy as np
import pytest
from chi_square import goodness_of_fit, homogeneity

from pyengine import LLM, SamplingParams

DATA = os.path.join(os.path.dirname(__file__), "data")
WRAPPER = os.path.join(DATA, "ckpt_wrapper_bf16")  # the test checkpoint with an MTP head
TEXT = os.path.join(DATA, "ckpt_text_bf16")  # the test checkpoint of the DFlash test draft
TEXT_DRAFT = os.path.join(DATA, "dflash_text_bf16")  # random weights: its drafts are rejected
PROMPTS = os.path.join(os.path.dirname(__file__), "..", "pyengine", "tools", "data", "prompts.jsonl")


def chat_prompts(llm, n):
    with open(PROMPTS) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [llm.tokenizer.encode(llm.apply_chat_template(rows[i % len(rows)]["messages"], enable_thinking=False))
            for i in range(n)]  # fmt: skip


def greedy(n_tokens, **kw):
    return SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True, **kw)


def run(llm, prompts, n_tokens):
    return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=greedy(n_tokens))]


@pytest.fixture(scope="module")
def default_plain():
    with LLM(max_model_len=2048, max_batch=16, chunked_prefill_size=128) as llm:
        prompts = chat_prompts(llm, 8)
        long_prompt = llm.tokenizer.encode("The history of the printing press. " * 120)[:1200]
        yield {"prompts": prompts, "long": long_prompt, "solo": run(llm, prompts[:3], 64),
               "batch": run(llm, prompts + [long_prompt], 40)}  # fmt: skip


@pytest.mark.parametrize("k", [1, 3, 5])
def test_default_model_spec_equals_plain_at_temperature_0(default_plain, k):
    with LLM(max_model_len=2048, max_batch=16, chunked_prefill_size=128, speculative_algorithm="mtp",
             speculative_num_draft_tokens=k) as llm:  # fmt: skip
        solo = [run(llm, [p], 64)[0] for p in default_plain["prompts"][:3]]
        assert solo == default_plain["solo"]
        before = llm.stats()
        # 8 requests decoding while a long prompt prefills in 128-token chunks; twice, the second
        # time from the prefix cache.
        for _ in range(2):
            assert run(llm, default_plain["prompts"] + [default_plain["long"]], 40) == default_plain["batch"]
        st = llm.stats()
        assert st["spec_verifies"] > 0 and len(st["spec_accept_per_position"]) == k
        assert st["spec_mean_accepted_length"] > 1.5  # the trained head on chat answers
        if k > 1:  # the batch's draft 2, from the chain's step over 8 sequences (the 8 alone: 0.33)
            drafted, accepted = (st[key][1] - before[key][1] for key in ("spec_drafted_per_position",
                                                                          "spec_accepted_per_position"))  # fmt: skip
            assert accepted > 0.2 * drafted
        assert st["prefix_cache_hit_tokens"] > 0
        assert st["gdn_slots_free"] == st["gdn_slots_total"] and st["running"] == 0


def test_prefix_cache_snapshots_taken_in_verify_steps_are_exact():
    """The next turn resumes from GDN snapshots taken inside verify chunks (block boundaries of the
    generated text, some of them past a rejected draft): its tokens equal a cold plain engine's."""
    with LLM(max_model_len=2048, speculative_algorithm="mtp", speculative_num_draft_tokens=5) as llm:
        first = chat_prompts(llm, 3)
        outs = run(llm, first, 90)
        follow = [p + o + llm.tokenizer.encode(" Now explain it.") for p, o in zip(first, outs)]
        hits = llm.stats()["prefix_cache_hit_tokens"]
        got = run(llm, follow, 40)
        assert llm.stats()["prefix_cache_hit_tokens"] - hits > sum(len(p) for p in first)  # into the answers
    with LLM(max_model_len=2048, prefix_cache=False) as llm:
        assert run(llm, follow, 40) == got


def test_test_checkpoint_spec_equals_plain_at_temperature_0():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 512, size=n).tolist() for n in (3, 17, 40, 90)]
    with LLM(WRAPPER, max_model_len=256, chunked_prefill_size=32) as llm:
        want = run(llm, prompts, 48)
    for k in (1, 3, 5):
        with LLM(WRAPPER, max_model_len=256, chunked_prefill_size=32, speculative_algorithm="mtp",
                 speculative_num_draft_tokens=k) as llm:  # fmt: skip
            assert run(llm, prompts, 48) == want, k
            assert [run(llm, [p], 48)[0] for p in prompts] == want, k


def dflash(path=TEXT_DRAFT, **kw):
    return {"speculative_algorithm": "dflash", "speculative_draft_model_path": path, **kw}


def test_dflash_spec_equals_plain_at_temperature_0_on_the_test_checkpoint():
    """Every block rejected: each verify step rolls back to the first position; the draft's cache
    follows every committed token, prefix-cache hits included (the second batched run)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 500, size=n).tolist() for n in (3, 17, 40, 90)]
    long_prompt = rng.integers(0, 500, size=200).tolist()
    kw = {"max_model_len": 256, "chunked_prefill_size": 32}
    with LLM(TEXT, **kw) as llm:
        want, want_batch = run(llm, prompts, 48), run(llm, prompts + [long_prompt], 40)
        page_bytes = llm.stats()["plan"]["kv_page_bytes"]
    with open(os.path.join(TEXT_DRAFT, "config.json")) as f:
        d = json.load(f)
    draft_page_bytes = d["num_hidden_layers"] * 2 * d["num_key_value_heads"] * d["head_dim"] * 16 * 4  # K, V fp32
    for k in (None, 3):
        with LLM(TEXT, **kw, **dflash(speculative_num_draft_tokens=k)) as llm:
            assert llm.stats()["plan"]["kv_page_bytes"] == page_bytes + draft_page_bytes  # the planner counts it
            assert [run(llm, [p], 48)[0] for p in prompts] == want, k
            for _ in range(2):
                assert run(llm, prompts + [long_prompt], 40) == want_batch, k
            st = llm.stats()
            assert len(st["spec_drafted_per_position"]) == (7 if k is None else k)  # block_size 8
            assert st["prefix_cache_hit_tokens"] > 0
            assert st["running"] == 0 and st["kv_pages_free"] == st["kv_pages_total"]
    with LLM(TEXT, **kw, **dflash(speculative_num_draft_tokens=2, draft_quant="int8")) as llm:
        assert run(llm, prompts, 48) == want


def test_dflash_options_are_checked():
    with pytest.raises(ValueError, match="needs speculative_draft_model_path"):
        LLM(TEXT, max_model_len=64, speculative_algorithm="dflash")
    with pytest.raises(ValueError, match="hidden_size 64 differs from the target's 384"):
        LLM(max_model_len=64, **dflash())  # the default model
    with pytest.raises(ValueError, match="config.json"):
        LLM(TEXT, max_model_len=64, **dflash(DATA))


def test_drafts_are_the_mtp_heads_argmax_over_the_same_tokens():
    """With k = 1 every verify drafts one token, MTP row m - 1 (pending token x_m) drafting x_{m+1}:
    replaying the verifies over the output with LLM.mtp_logits gives the request's own counts."""
    with LLM(max_model_len=1024, prefix_cache=False, speculative_algorithm="mtp",
             speculative_num_draft_tokens=1) as llm:  # fmt: skip
        prompt = chat_prompts(llm, 1)[0]
        max_tokens = 80
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(max_tokens))[0]
        seq = prompt + out.token_ids
        drafts = llm.mtp_logits(seq).argmax(1)  # row p drafts seq[p + 2]
    P, m, drafted, accepted = len(prompt), len(prompt), 0, 0
    while m - P + 2 < max_tokens:  # pending x_m is output token m - P; a draft needs room for 2 more
        drafted += 1
        ok = drafts[m - 1] == seq[m + 1]
        accepted += int(ok)
        m += 2 if ok else 1
    assert out.speculative["spec_drafted_per_position"] == [drafted]
    assert out.speculative["spec_accepted_per_position"] == [accepted]
    assert accepted > drafted // 2


def test_opt_out_grammar_and_usage_counts():
    with LLM(max_model_len=1024, speculative_algorithm="mtp") as llm:
        prompt = chat_prompts(llm, 1)[0]
        on = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(32))[0]
        off = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(32, speculative=False))[0]
        assert on.token_ids == off.token_ids
        assert off.speculative["spec_drafted_per_position"] == []
        s = on.speculative
        assert s["spec_verifies"] == s["spec_drafted_per_position"][0] > 0
        assert s["spec_mean_accepted_length"] == pytest.approx((sum(s["spec_accepted_per_position"]) + s["spec_verifies"])
                                                               / s["spec_verifies"])  # fmt: skip
        assert len(on.token_ids) == 32
        with pytest.raises(ValueError, match="speculative must be true or false"):
            SamplingParams(speculative=1)


def test_options_are_checked():
    with pytest.raises(ValueError, match="speculative_algorithm must be one of"):
        LLM(WRAPPER, max_model_len=64, speculative_algorithm="eagle")
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        LLM(WRAPPER, max_model_len=64, speculative_algorithm="mtp", speculative_num_draft_tokens=9)
    with pytest.raises(ValueError, match="no MTP head|MTP head"):
        LLM(os.path.join(DATA, "ckpt_text_bf16"), max_model_len=64, speculative_algorithm="mtp")


# ---- lossless sampling: the first two tokens' joint distribution ----

PROMPT = [5, 17, 99, 3, 200, 41, 7]  # the test checkpoint (random weights: drafts mostly rejected)
# The default model about to write a function's body (its head's drafts often accepted).
CODE = "def add(a, b):\n    return"
# At temperature 0.7 / top_p 0.9 the body's first two tokens take 4 values that matter: a prose
# start spreads over about 100 pairs (20,000 samples: >= 5 expected counts each).
PROSE = "The history of"


def first_two(llm, prompt, n, seed0, **sp):
    # max_tokens 2 + k: the second token comes out of a verify of k drafts.
    k = llm.engine_args.speculative_num_draft_tokens if llm.engine_args.speculative_algorithm != "none" else 1
    params = [SamplingParams(max_tokens=2 + k, seed=seed0 + i, ignore_eos=True, **sp) for i in range(n)]
    outs = llm.generate(prompt_token_ids=[prompt] * n, sampling_params=params)
    return [tuple(o.token_ids[:2]) for o in outs]


def exact_joint(llm, prompt, temperature, top_p, first_tokens):
    """{(x1, x2): p} from prompt_logits under the sampling transform, for x1 in first_tokens (the
    ones the samples hold; the other pairs' mass is what the tests pool as the rest)."""
    def dist(logits):
        z = logits.astype(np.float64) / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < top_p  # the smallest set with mass >= top_p
        q = np.zeros_like(p)
        q[order[keep]] = p[order[keep]]
        return q / q.sum()

    p1 = dist(llm.prompt_logits(prompt)[-1])
    joint = {}
    for x1 in sorted(first_tokens):
        p2 = dist(llm.prompt_logits(prompt + [int(x1)])[-1])
        for x2 in np.nonzero(p2)[0]:
            joint[(int(x1), int(x2))] = p1[x1] * p2[x2]
    return joint


def check_lossless(model, n, temperature, top_p, k, min_acceptance=0.0, against_plain=True, spec=None, text=CODE):
    """spec: the speculative options (default: the MTP head's); text: the default model's prompt."""
    spec = spec or {"speculative_algorithm": "mtp"}
    sp = {"temperature": temperature, "top_p": top_p}
    plain = []
    if against_plain:
        with LLM(model, max_model_len=128, max_batch=64, prefix_cache=False) as llm:
            plain = first_two(llm, PROMPT if model else llm.tokenizer.encode(text), n, 0, **sp)
    # Steps in full chunks (no pacer, whose cuts follow measured times): the same batches each run,
    # so the same seeds give the same tokens (a different batch layout may round a logit otherwise).
    with LLM(model, max_model_len=128, max_batch=64, prefix_cache=False, speculative_num_draft_tokens=k,
             max_step_ms=-1, **spec) as llm:  # fmt: skip
        prompt = PROMPT if model else llm.tokenizer.encode(text)
        spec = first_two(llm, prompt, n, 10**6, **sp)
        st = llm.stats()
        assert st["spec_verifies"] >= n  # every second token comes out of a verify
        assert st["spec_accept_per_position"][0] >= min_acceptance
        assert spec == first_two(llm, prompt, n, 10**6, **sp)  # seeded: reproducible
        exact = exact_joint(llm, prompt, temperature, top_p, {x1 for x1, _ in spec + plain})
    p_spec, dof = goodness_of_fit(spec, exact)
    assert dof >= 10
    assert p_spec > 0.01, p_spec
    if against_plain:
        p_plain, _ = goodness_of_fit(plain, exact)
        p_same, _ = homogeneity(spec, plain)
        assert p_same > 0.01, (p_same, p_plain)
        assert p_plain > 0.001  # the reference itself (looser: it is not what is tested)


@pytest.mark.parametrize("temperature,top_p,k", [(1.0, 1.0, 1), (0.7, 0.9, 2)])
def test_sampling_is_lossless(temperature, top_p, k):
    check_lossless(WRAPPER, 3000, temperature, top_p, k)


def test_dflash_sampling_is_lossless():
    check_lossless(TEXT, 2000, 1.0, 1.0, 2, spec=dflash())


def test_sampling_is_lossless_where_most_drafts_are_accepted():
    """Half the drafts accepted: a biased acceptance test shows here (drawing u_accept from [0, 0.5)
    gives p ~ 1e-20), where the random checkpoint's rare acceptances hide it."""
    check_lossless(None, 1200, 1.0, 1.0, 2, min_acceptance=0.4, against_plain=False)


@pytest.mark.slow
@pytest.mark.parametrize("model", [WRAPPER, None])  # None: the default model
@pytest.mark.parametrize("temperature,top_p,k", [(1.0, 1.0, 1), (1.0, 1.0, 3), (0.7, 0.9, 2)])
def test_sampling_is_lossless_20000_samples(model, temperature, top_p, k):
    check_lossless(model, 20000, temperature, top_p, k, text=CODE if temperature == 1.0 else PROSE)


def test_server_reports_acceptance_in_usage_and_metrics():
    from webapp import create_app

    llm = LLM(max_model_len=1024, speculative_algorithm="mtp")
    try:
        client = create_app(llm, served_model_name="m").test_client()
        body = {"model": "m", "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
                "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
        on = client.post("/v1/chat/completions", json=body).json
        off = client.post("/v1/chat/completions", json={**body, "speculative": False}).json
        assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
        u = on["usage"]
        assert u["completion_tokens"] == 40 and u["spec_drafted_per_position"][0] > 0
        assert len(u["spec_accept_per_position"]) == 3 and u["spec_mean_accepted_length"] > 1.0
        assert "spec_drafted_per_position" not in off["usage"]
        metrics = client.get("/metrics").get_data(as_text=True)
        assert 'pyengine_spec_draft_tokens_total{position="1"}' in metrics
        assert 'pyengine_spec_accepted_tokens_total{position="3"}' in metrics
        assert "pyengine_spec_verifies_total" in metrics
        assert "pyengine_spec_propose_seconds_total" in metrics  # the proposer's share of step time
    finally:
        llm.close()


def test_stops_inside_accepted_drafts_end_the_output_where_plain_decoding_does():
    outs = {}
    for algo in ("none", "mtp"):
        with LLM(max_model_len=2048, speculative_algorithm=algo, speculative_num_draft_tokens=5) as llm:
            prompts = chat_prompts(llm, 4)
            stop_id = llm.tokenizer.encode(" the")[0]
            sps = [SamplingParams(max_tokens=300, temperature=0.0), SamplingParams(max_tokens=37, temperature=0.0),
                   SamplingParams(max_tokens=300, temperature=0.0, stop_token_ids=[stop_id]),
                   SamplingParams(max_tokens=300, temperature=0.0, logprobs=2)]  # fmt: skip
            res = llm.generate(prompt_token_ids=prompts, sampling_params=sps)
            outs[algo] = [(o.token_ids, o.finish_reason, [round(e["logprob"], 4) for e in o.logprobs or []])
                          for o in res]  # fmt: skip
            assert llm.stats()["running"] == 0 and llm.stats()["kv_pages_free"] == llm.stats()["kv_pages_total"]
    assert outs["mtp"] == outs["none"]
    assert outs["none"][2][1] == "stop" and outs["none"][3][2]  # a stop id ended one; logprobs came


@pytest.mark.slow
@pytest.mark.parametrize("algo,k", [("mtp", 1), ("mtp", 3), ("mtp", 5), ("dflash", None)])
def test_default_model_50_prompts_spec_equals_plain(algo, k):
    check_50_prompts(algo, k)


def check_50_prompts(algo, k, **device):
    """50 chat prompts (the bench set, cycled, each with its index so no two are equal), alone and
    8 at a time beside a long prefill, prefix cache on; MTP k = 1, 3, 5 and the DFlash draft."""
    kw = {"max_model_len": 2048, "max_batch": 16, "chunked_prefill_size": 128, **device}
    with LLM(**kw) as llm:
        base = chat_prompts(llm, 50)
        prompts = [p[:-4] + llm.tokenizer.encode(f" ({i})") + p[-4:] for i, p in enumerate(base)]
        long_prompt = llm.tokenizer.encode("The history of the printing press. " * 120)[:1200]
        solo = [run(llm, [p], 64)[0] for p in prompts]
        groups = [prompts[i : i + 8] + [long_prompt] for i in range(0, 50, 8)]
        batched = [run(llm, g, 48) for g in groups]
    spec = {"speculative_algorithm": "mtp"} if algo == "mtp" else dflash(DEFAULT_DRAFT)
    with LLM(speculative_num_draft_tokens=k, **spec, **kw) as llm:
        assert [run(llm, [p], 64)[0] for p in prompts] == solo
        assert [run(llm, g, 48) for g in groups] == batched


def test_auto_takes_the_model_directorys_proposer(tmp_path):
    """speculative_algorithm auto (the CLI's default): the embedded model's speculative.json names
    its proposer (DFlash, MTP under tensor parallel); a directory without one decodes plainly, a
    DFlash one under tensor parallel takes its tensor_parallel_fallback (default none)."""
    from pyengine.engine import resolve_auto_speculation

    with LLM(max_model_len=256, speculative_algorithm="auto") as llm:
        assert llm.engine_args.speculative_algorithm == "dflash"
        draft = os.path.normpath(llm.engine_args.speculative_draft_model_path)
        assert draft.endswith(os.path.join("default_model", "dflash")) and os.path.isdir(draft)
    kw = {"speculative_algorithm": "auto", "tensor_parallel_size": 2}
    resolve_auto_speculation(os.path.dirname(DEFAULT_DRAFT), kw)
    assert kw == {"speculative_algorithm": "mtp", "tensor_parallel_size": 2}
    with LLM(TEXT, max_model_len=64, speculative_algorithm="auto") as llm:
        assert llm.engine_args.speculative_algorithm == "none"
    model = tmp_path / "m"
    shutil.copytree(TEXT, model)
    (model / "speculative.json").write_text(json.dumps({"speculative_algorithm": "dflash",
                                                        "speculative_draft_model_path": TEXT_DRAFT}))  # fmt: skip
    kw = {"speculative_algorithm": "auto"}
    resolve_auto_speculation(str(model), kw)
    assert kw == {"speculative_algorithm": "dflash", "speculative_draft_model_path": TEXT_DRAFT}
    kw = {"speculative_algorithm": "auto", "tensor_parallel_size": 2}
    resolve_auto_speculation(str(model), kw)
    assert kw["speculative_algorithm"] == "none"
    (model / "speculative.json").write_text(json.dumps({"speculative_algorithm": "dflash",
                                                        "speculative_draft_model_path": TEXT_DRAFT,
                                                        "tensor_parallel_fallback": "eagle"}))  # fmt: skip
    with pytest.raises(ValueError, match="speculative.json: tensor_parallel_fallback must be mtp or none"):
        resolve_auto_speculation(str(model), {"speculative_algorithm": "auto"})
    (model / "speculative.json").write_text(json.dumps({"speculative_algorithm": "eagle"}))
    with pytest.raises(ValueError, match="speculative.json: speculative_algorithm must be mtp or dflash"):
        LLM(str(model), max_model_len=64, speculative_algorithm="auto")


# ---- the default model's own DFlash draft (pyengine/default_model/dflash) ----

DEFAULT_DRAFT = os.path.join(os.path.dirname(__file__), "..", "pyengine", "default_model", "dflash")


def test_default_model_dflash_spec_equals_plain_at_temperature_0(default_plain):
    with LLM(max_model_len=2048, max_batch=16, chunked_prefill_size=128, **dflash(DEFAULT_DRAFT)) as llm:
        assert [run(llm, [p], 64)[0] for p in default_plain["prompts"][:3]] == default_plain["solo"]
        for _ in range(2):
            assert run(llm, default_plain["prompts"] + [default_plain["long"]], 40) == default_plain["batch"]
        st = llm.stats()
        assert st["spec_accept_per_position"][0] > 0.15  # the CPU-trained draft on chat answers (measured 0.27)
        assert st["prefix_cache_hit_tokens"] > 0
        assert st["gdn_slots_free"] == st["gdn_slots_total"] and st["running"] == 0


def test_dflash_drafts_are_the_drafts_argmax_over_the_same_tokens():
    """With k = 1 every verify drafts block row 0 from the context of every computed token and the
    pending token: replaying the verifies over the output with DFlashDraft.block_logits gives the
    request's own counts."""
    from pyengine.dflash import DFlashDraft

    with LLM(max_model_len=1024, prefix_cache=False, **dflash(DEFAULT_DRAFT, speculative_num_draft_tokens=1)) as llm:
        prompt = chat_prompts(llm, 1)[0]
        max_tokens = 80
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(max_tokens))[0]
        seq = prompt + out.token_ids
        draft = DFlashDraft(DEFAULT_DRAFT, llm)
        try:
            P = len(prompt)
            blocks = draft.block_logits(seq, context_ends=list(range(P, len(seq) - 1)))
        finally:
            draft.close()
    drafts = {P + i: int(b[0].argmax()) for i, b in enumerate(blocks)}  # pending x_m drafts x_{m+1}
    m, drafted, accepted = P, 0, 0
    while m - P + 2 < max_tokens:
        drafted += 1
        ok = drafts[m] == seq[m + 1]
        accepted += int(ok)
        m += 2 if ok else 1
    assert out.speculative["spec_drafted_per_position"] == [drafted]
    assert out.speculative["spec_accepted_per_position"] == [accepted]
    assert accepted > 0


def test_default_model_dflash_sampling_is_lossless():
    check_lossless(None, 1200, 1.0, 1.0, 3, against_plain=False, spec=dflash(DEFAULT_DRAFT))


def check_dummy_mtp_head(tmp_path, **options):
    """load_format dummy fills the MTP head the config names (tools/bench_spec_gpu.py speculates on
    the 27B shape with dummy weights), and speculation on it gives plain decoding's tokens."""
    d = tmp_path / "dummy"
    d.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(WRAPPER, name), d)
    kw = {"load_format": "dummy", "max_model_len": 128, "max_batch": 2, **options}
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 9, 13, 17], [3, 4]]
    with LLM(str(d), **kw) as llm:
        plain = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp)]
    with LLM(str(d), speculative_algorithm="mtp", speculative_num_draft_tokens=3, **kw) as llm:
        assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp)] == plain
        assert llm.stats()["spec_verifies"] > 0


def test_dummy_weights_fill_a_configured_mtp_head(tmp_path):
    check_dummy_mtp_head(tmp_path)
