"""Loss-curve figures of the model card from the training log (.train/ckpt/loss.csv).

  python3 tools/default_model/card/make_figures.py [--csv .train/ckpt/loss.csv]
writes loss.png and heldout.png next to this file.
"""

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--csv", type=Path, default=HERE.parent.parent.parent / ".train" / "ckpt" / "loss.csv"
    )
    args = ap.parse_args()
    rows = list(csv.DictReader(args.csv.open()))
    train = [r for r in rows if r["loss"]]
    ev = [r for r in rows if r["code_ppl"]]
    mt = lambda rs: [int(r["tokens"]) / 1e6 for r in rs]
    boundary = min(int(r["tokens"]) for r in rows if r["call"] == "2") / 1e6

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=90)
    ax.plot(mt(train), [float(r["lm_loss"]) for r in train], label="LM loss (next token)")
    ax.plot(mt(train), [float(r["mtp_loss"]) for r in train], label="MTP loss (token t+2)")
    ax.axvline(boundary, color="grey", lw=0.8, ls="--")
    ax.text(boundary, ax.get_ylim()[1] * 0.9, " call 2", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([0.7, 1, 1.5, 2, 3, 5, 10])
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("Training loss (batch 32 x 1024, 50-step means)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "loss.png")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=90)
    for key, label in (
        ("code_ppl", "code*"),
        ("prose_ppl", "prose"),
        ("wiki_chat_ppl", "wiki chat"),
    ):
        a1.plot(mt(ev), [float(r[key]) for r in ev], marker="o", ms=3, label=label)
    a1.set_yscale("log")
    a1.set_title("Held-out perplexity (in-training eval)", fontsize=9)
    a1.set_xlabel("training tokens (M)")
    a1.legend(fontsize=7)
    for key, label in (("code_mtp_accept1", "code"), ("prose_mtp_accept1", "prose")):
        a2.plot(mt(ev), [float(r[key]) for r in ev], marker="o", ms=3, label=label)
    a2.axhline(0.6, color="grey", lw=0.8, ls=":")
    a2.set_title("MTP top-1 = main top-1 at t+1 (teacher forced)", fontsize=9)
    a2.set_xlabel("training tokens (M)")
    a2.legend(fontsize=7)
    a1.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    a1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a1.set_yticks([3, 5, 10, 20, 30, 50])
    for a in (a1, a2):
        a.axvline(boundary, color="grey", lw=0.8, ls="--")
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "heldout.png")


if __name__ == "__main__":
    main()
