"""`--plot`: throughput bars (images/s over the whole timed window, the table's figure, with the interquartile range
of its slices) and stacked per-sample stage times."""

from __future__ import annotations

from pathlib import Path

from .result import STAGE_NAMES, BenchResult

_COLORS = {"read": "#8c8c8c", "decode": "#4c72b0", "augment": "#dd8452", "collate": "#55a868", "copy": "#c44e52"}


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install -e '.[plot]' in the fastfeed checkout") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(result: BenchResult, path) -> Path:
    plt = _pyplot()
    path = Path(path)
    rs, cfg = result.results, result.config
    names = [r.name + (f"\n{r.workers} worker(s)" if r.ok else f"\n({r.status})") for r in rs]
    x = range(len(rs))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)

    rate = [r.images_per_s.overall if r.ok else 0.0 for r in rs]   # the headline: the whole window, as the table
    lo = [max(r.images_per_s.overall - r.images_per_s.slice_p25, 0.0) if r.ok else 0.0 for r in rs]
    hi = [max(r.images_per_s.slice_p75 - r.images_per_s.overall, 0.0) if r.ok else 0.0 for r in rs]
    width = min(0.7, 0.25 * max(len(rs), 2))
    bars = ax1.bar(x, rate, width=width, yerr=[lo, hi], capsize=4,
                   color=["#4c72b0" if not r.fastest else "#2a9d8f" for r in rs])
    for b, r in zip(bars, rs):
        label = (f"{r.images_per_s.overall:.0f}" + (" !" if r.unreliable else "")
                 + (f"\n{r.ratio:.2f}x" if r.ratio is not None else "")) if r.ok else "n/a"
        top = max(r.images_per_s.slice_p75, r.images_per_s.overall) if r.ok else 0.0   # above the error bar
        ax1.annotate(label, (b.get_x() + b.get_width() / 2, max(b.get_height(), top)), ha="center", va="bottom",
                     xytext=(0, 4), textcoords="offset points", fontsize=9)
    ax1.set_ylabel("images/s over the window (IQR of slices)")
    step = cfg.get("step_ms")
    ax1.set_title("throughput" + (f" with a {step:g} ms step" if step is not None else
                                  f" with the {cfg['model']} step" if cfg.get("model") else ""))
    ax1.margins(y=0.2)

    bottom = [0.0] * len(rs)
    for stage in STAGE_NAMES:
        vals = [(r.stage_ms_per_sample or {}).get(stage, 0.0) if r.ok else 0.0 for r in rs]
        if stage == "copy" and not any(r.copy_applicable for r in rs):
            continue
        ax2.bar(x, vals, width=width, bottom=bottom, label=stage, color=_COLORS[stage])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylabel("ms per sample (wall time in each stage)")
    ax2.set_title("where a sample's time goes")
    ax2.legend(fontsize=8, loc="upper right")
    ax2.margins(y=0.15)
    for ax in (ax1, ax2):
        ax.set_xticks(list(x), names)
        if len(rs) < 3:
            ax.set_xlim(-1, len(rs))

    st = result.store
    fig.suptitle(f"fastfeed bench: {Path(st['path']).name} ({st['images']} images), imgsz {cfg['imgsz']}, "
                 f"batch {cfg['batch_size']}, augment {'on' if cfg['augment'] else 'off'}, "
                 f"{result.machine['cores_usable']} cores", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
