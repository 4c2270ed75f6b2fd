"""The PNGs of `--plot`: one figure per command, drawn from the same dict that `--out` writes."""

from __future__ import annotations


def require_matplotlib() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'pyengine[tools]'"
    return None


def _figure(n_panels: int, title: str, width_per_panel: float = 5.0):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n_panels, figsize=(width_per_panel * n_panels, 4.2), squeeze=False)
    fig.suptitle(title, fontsize=11)
    return fig, axes[0]


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _target(result: dict) -> str:
    t = result.get("target") or {}
    return f"{t.get('model')} @ {t.get('endpoint')}"


def plot_bench(result: dict, path: str) -> None:
    cells = result["cells"]
    s = result["settings"]
    fig, (ax_tok, ax_itl) = _figure(2, f"pyengine bench: {_target(result)}, {s['max_tokens']} tokens, "
                                       f"median of {s['runs']} run{'s' if s['runs'] > 1 else ''}")  # fmt: skip
    kinds = list(dict.fromkeys(c["kind"] for c in cells))
    levels = sorted({c["concurrency"] for c in cells})
    series = []  # (label, {kind: value})
    for c in levels:
        row = {x["kind"]: x for x in cells if x["concurrency"] == c}
        name = f"{c} stream{'s' if c > 1 else ''}"
        series.append((f"{name}: per stream", {k: row[k]["tok_s"] for k in kinds}))
        if c > 1:
            series.append((f"{name}: combined", {k: row[k]["combined_tok_s"] for k in kinds}))
    width = 0.8 / len(series)
    for j, (label, values) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(kinds))]
        ax_tok.bar(xs, [values[k] or 0 for k in kinds], width, label=label)
    top = max((v or 0 for _, values in series for v in values.values()), default=0)
    ax_tok.set_ylim(0, top * 1.35 or 1)  # room for the legend above the bars
    ax_tok.set_xticks(range(len(kinds)), kinds)
    ax_tok.set_ylabel("tokens / s")
    ax_tok.set_title("throughput (client-timed)")
    ax_tok.legend(fontsize=8, loc="upper left", ncol=2)
    for cell in cells:
        gaps = sorted(g * 1000 for g in cell["itl_all_s"])
        if gaps:
            ys = [(i + 1) / len(gaps) for i in range(len(gaps))]
            ax_itl.step(gaps, ys, where="post", label=f"{cell['kind']}, c={cell['concurrency']}")
    ax_itl.set_xscale("log")
    ax_itl.set_xlabel("inter-token latency (ms, log)")
    ax_itl.set_ylabel("share of gaps <= x")
    ax_itl.set_title("ITL distribution")
    ax_itl.legend(fontsize=8)
    _save(fig, path)


def plot_stress(result: dict, path: str) -> None:
    ratios = result["ratios"]
    names = [n for n in ratios if ratios[n]["values"]]
    fig, (ax,) = _figure(1, f"pyengine stress: {_target(result)}, {result['cycles_done']} cycles, "
                            f"{result['errors']} errors, {result['wrong_answers']} wrong", 9.0)  # fmt: skip
    data = [ratios[n]["values"] for n in names]
    if data:
        ax.boxplot(data, vert=False, whis=(5, 95))
        for i, vals in enumerate(data):
            ax.plot(vals, [i + 1] * len(vals), "o", alpha=0.5, markersize=4)
        ax.set_yticks(range(1, len(names) + 1), [ratios[n]["label"] for n in names], fontsize=8)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("ratio, log scale (boxes: quartiles, whiskers p5-p95; dots: cycles)")
    _save(fig, path)


def plot_kv_depth(result: dict, path: str) -> None:
    fig, (ax_dec, ax_ttft, ax_probe) = _figure(3, "pyengine kv-depth: agent session and prefill probes by depth")
    for cfg in result["configs"]:
        turns = [t for t in cfg["session"] if t["prompt_tokens"]]
        depth = [t["prompt_tokens"] for t in turns]
        ax_dec.plot(depth, [t["decode_tok_s"] for t in turns], "o-", label=cfg["label"], markersize=4)
        ax_ttft.plot(depth, [t["ttft_s"] for t in turns], "o-", label=cfg["label"], markersize=4)
        probes = [p for p in cfg["probes"] if p["prompt_tokens"]]
        ax_probe.plot([p["prompt_tokens"] for p in probes], [p["prefill_tok_s"] for p in probes], "s--",
                      label=cfg["label"])
        short = cfg["short"]["decode_tok_s"]
        if short:
            ax_dec.axhline(short, linestyle=":", linewidth=0.8, color=ax_dec.lines[-1].get_color())
    ax_dec.set_title("decode tok/s per turn (dotted: short context)")
    ax_ttft.set_title("first-token time per turn")
    ax_probe.set_title("cache-busted prefill probes")
    for ax, label in ((ax_dec, "tokens / s"), (ax_ttft, "seconds"), (ax_probe, "prompt tokens / s")):
        ax.set_xlabel("context depth (prompt tokens)")
        ax.set_ylabel(label)
        ax.margins(y=0.15)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_eval(result: dict, path: str) -> None:
    by_type = result["by_type"]
    types = list(by_type)
    fig, (ax,) = _figure(1, f"pyengine eval: {_target(result)}", 7.0)
    acc = [by_type[t]["accuracy"] for t in types]
    bars = ax.bar(types, acc)
    for bar, t in zip(bars, types):
        ax.annotate(f"{by_type[t]['correct']}/{by_type[t]['items']}", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=9)  # fmt: skip
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    _save(fig, path)
