"""`format_table(result)`: the terminal table, as a string (the CLI prints it). `write_plot(result, path)` (`--plot`):
throughput bars (images/s over the whole timed window, the table's figure, with the interquartile range of its
slices) and stacked per-sample stage times; matplotlib is imported only then (the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from ..store.remote.link import link_words
from ..store.remote.sizes import human_bytes
from ..train.verdict import BUSY_MIN, advice
from .result import STAGE_NAMES, BenchResult, LoaderResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _row(r: LoaderResult, stall_mode: bool) -> list[str]:
    name = r.name + (" *" if r.fastest else "")
    workers = str(r.workers) if r.workers is not None else "-"
    if not r.ok:
        return [name, workers, f"{r.status}: {r.error.splitlines()[0] if r.error else ''}"]
    ips, bps = r.images_per_s, r.batches_per_s
    stages = r.stage_ms_per_sample or {}
    rate = f"{ips.overall:.0f} ±{100 * ips.spread:.0f}%" + (" !" if r.unreliable else "")
    cells = [name, workers, rate, f"{bps.overall:.2f}",
             f"{r.ratio:.2f}x" if r.ratio is not None else "-", f"{r.first_batch_s:.2f} s"]
    cells += [_ms(stages.get(k)) for k in STAGE_NAMES[:-1]]
    cells.append(_ms(stages.get("copy")) if r.copy_applicable else "-")
    cells += [f"{r.cpu['total_percent']:.0f}%" if r.cpu.get("total_percent") is not None else "-",
              human_bytes(r.memory.get("peak_bytes")), human_bytes(r.shared_bytes)]
    if stall_mode:
        s = r.stall
        cells += [f"{100 * s.stall_fraction:.0f}%",
                  f"{s.steps_per_s:.1f}" + (f" of {s.step_only_per_s:.1f}" if s.step_only_per_s else "")]
    return cells


def describe_order(d: dict) -> str:
    """An EpochOrder.describe() in words: the global shuffle, or the windowed order and its window."""
    if d.get("order") == "windowed":
        size = f", {human_bytes(d['window_bytes'])}" if d.get("window_bytes") else ""
        text = (f"windowed (shard-aware): a window of {d['window_shards']} of {d['shards']} shards{size}, "
                f"{d['nodes']} node(s) x {d['local_ranks']} local rank(s)")
    else:
        text = f"{d.get('order')} ({d.get('scope', '-')})"
    if "read_ahead_shards" in d:
        text += f"; shards read ahead: {d['read_ahead_shards']}, shard cache limit {human_bytes(d.get('cache_limit'))}"
    if d.get("link"):
        text += f"; link: {link_words(d['link'])}"
    return text


def format_table(result: BenchResult) -> str:
    cfg, m = result.config, result.machine
    stall_mode = bool(cfg.get("stall_mode"))
    mem_metric = next((r.memory.get("metric") for r in result.results if r.ok), "pss").upper()
    heads = ["loader", "workers", "images/s", "batches/s", f"vs {result.baseline or '-'}", "1st batch",
             "read", "decode", "augment", "collate", "copy", "CPU", f"peak {mem_metric}", "shared"]
    if stall_mode:
        heads += ["stall", "steps/s"]
    rows = [_row(r, stall_mode) for r in result.results]
    full = [r for r in rows if len(r) == len(heads)]
    widths = [max(len(h), *(len(r[i]) for r in full)) if full else len(h) for i, h in enumerate(heads)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    s0 = heads.index("read")
    span = sum(widths[s0:s0 + 5]) + 2 * 4
    group = " " * (sum(widths[:s0]) + 2 * s0) + "ms per sample".center(span, "-")

    timed = f"{cfg['batches']} timed batches" if cfg.get("batches") else f"{cfg['seconds']:g} s"
    st = result.store
    payload = (st.get("payload") or {}).get("store", "?")
    task = (st.get("task") or {}).get("name", "detect")
    out = [f"fastfeed bench  {st['path']} ({st['images']} images, {payload}, task {task})  imgsz {cfg['imgsz']}  "
           f"batch {cfg['batch_size']}  augment {'on' if cfg['augment'] else 'off'}  device {cfg['device']}",
           f"  {timed} per loader after {max(cfg['warmup'], 1)} untimed batch(es); {m['cpu_model']}, "
           f"{m['cores_usable']} cores, {human_bytes(m['ram_bytes'])} RAM; torch {m['versions']['torch']}",
           "", group, line(heads), line(["-" * w for w in widths])]
    for cells in rows:   # a loader that did not run: its name, workers and error
        out.append(line(cells) if len(cells) == len(heads) else
                   "  ".join([cells[0].ljust(widths[0]), cells[1].rjust(widths[1]), cells[2]]))

    out.append("")
    ran = [r for r in result.results if r.ok]
    if ran:
        out += [f"* fastest. images/s: the images of the whole timed window / its length: what ranks, and vs (against "
                f"{result.baseline}).",
                "  ±: half the interquartile range of the rates in ~10 equal slices of the window; !: not a steady figure (why below).",
                "  ms per sample: wall time inside the workers, summed over workers; copy: host->device (- on cpu, and for",
                "  loaders whose batches come out on the device; their decode/augment are the device's own times).",
                "  CPU: the whole machine (other users included) over the timed window.",
                f"  peak {mem_metric}: summed over this process and the loader's workers"
                + (" (PSS splits shared pages)." if mem_metric == "PSS" else " (RSS: shared pages counted per process).")]
        if stall_mode:
            out.append(f"  stall: share of wall time waiting for a batch with {_step(cfg)}; steps/s of the step-only rate.")
    for r in result.results:
        if r.ok and r.unreliable:
            out.append(f"  ! {r.name}: unreliable: {r.unreliable}")
        extra = []
        if r.ok and r.cpu.get("per_core_percent"):
            extra.append("CPU per core " + " ".join(f"{p:.0f}%" for p in r.cpu["per_core_percent"]))
        if r.ok and (pc := r.cpu.get("process_cores")):
            extra.append(f"bench processes used {pc['workers'] + pc['main']:.2f} cores (workers {pc['workers']:.2f})")
        if r.ok and r.worker_busy_fraction is not None:
            extra.append(f"workers busy {100 * r.worker_busy_fraction:.0f}%")
        if extra:
            out.append(f"  {r.name}: " + "; ".join(extra))
        if r.sweep is not None:
            out.append(f"  {r.name}: --workers auto chose {r.sweep.chosen}: {r.sweep.reason}")
        if r.ok and r.order:
            out.append(f"  {r.name}: order {describe_order(r.order)}")
        for note in r.notes:
            out.append(f"  {r.name}: note: {note}")
    if verdict := conclusion(result):
        out += ["", verdict]
    return "\n".join(out).rstrip() + "\n"


def _step(cfg: dict) -> str:
    return f"a {cfg['step_ms']:g} ms step" if cfg.get("step_ms") is not None else f"the {cfg.get('model')} step"


def conclusion(result: BenchResult) -> str | None:
    """The table's last line. Without a step: what the figures are not (the training speed) and the flags that
    give a verdict. With --step-ms / --model: which loaders keep that step fed, by the trainer's own rule (the
    step computing at least BUSY_MIN of the time), and what to try when none does."""
    cfg, ran = result.config, [r for r in result.results if r.ok]
    if not ran:
        return None
    if not cfg.get("stall_mode"):
        return ("no verdict for your training: images/s is each loader's ceiling (loading alone), not your training "
                "speed, which a slower model step caps (usual on a CPU); --step-ms MS or --model NAME says which "
                "loader keeps your step fed.")
    fed_max, step = 1 - BUSY_MIN, _step(cfg)

    def waits(rs):
        return ", ".join(f"{r.name} {100 * r.stall.stall_fraction:.0f}%" for r in rs)

    fed = [r for r in ran if r.stall.stall_fraction <= fed_max]
    starved = [r for r in ran if r not in fed]
    if fed:
        return (f"verdict with {step}: kept fed by {', '.join(r.name for r in fed)} (waiting for data: {waits(fed)} of "
                f"the time, at most {fed_max:.0%} counts as fed): there the step sets the training speed"
                + (f"; starved by {waits(starved)}." if starved else "."))
    best = min(ran, key=lambda r: r.stall.stall_fraction)
    tips = advice("data", {"loader": best.name, "workers": best.workers, "cores": result.machine.get("cores_usable"),
                           "device": str(cfg.get("device", "cpu")).split(":")[0]})
    return (f"verdict with {step}: every loader starves it (waiting for data: {waits(ran)} of the time; at most "
            f"{fed_max:.0%} counts as fed): loading sets the training speed; to go faster: {'; '.join(tips)}.")


_COLORS = {"read": "#8c8c8c", "decode": "#4c72b0", "augment": "#dd8452", "collate": "#55a868", "copy": "#c44e52"}


def write_plot(result: BenchResult, path) -> Path:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install -e '.[plot]' in the fastfeed checkout") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax1.set_title("throughput" + (f" with {_step(cfg)}" if cfg.get("step_ms") is not None or cfg.get("model") else ""))
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
