"""The bottleneck verdict: where a training step's time goes (data, h2d, compute, comm), judged against the health
figures, and what to try (the parts, the figures and the rule: docs/training.md, "The bottleneck verdict")."""

from __future__ import annotations

PARTS = ("data", "h2d", "compute", "comm")   # the step's split, as `report.Meter` times it
BUSY_MIN = 0.85            # compute share of the step
MEM_MAX = 0.90             # peak reserved / device total
DATA_MS_PER_IMAGE_MAX = 5.0
COMM_MAX = 0.15            # exposed all-reduce share of the step

WHAT = {"data": "waiting for data", "h2d": "waiting for host->device copies", "comm": "in DDP all-reduce",
        "compute": "computing"}


def smaller_settings(model: str, imgsz: int) -> list[str]:
    """The settings that shrink a run's compute, leaving out those it already has."""
    tips = ["--model yolov3-tiny (about 12x less compute)"] if model != "yolov3-tiny" else []
    if imgsz > 320:
        tips.append(f"--imgsz 320 (about {(imgsz / 320) ** 2:.0f}x fewer pixels)")
    return tips


def advice(part: str, ctx: dict) -> list[str]:
    """What to try for `part`, leaving out what the run already does and what cannot run on its device.
    ctx: loader, workers, cores, device, amp, channels_last, device_augment, batch_auto, model, imgsz."""
    accel = ctx.get("device", "cpu") != "cpu"
    if part == "data":
        tips = [] if ctx.get("loader") == "shm" else ["--loader shm (every image decoded once, shared by all workers)"]
        if ctx.get("workers") is not None and ctx.get("cores") and ctx["workers"] < ctx["cores"]:
            tips.append(f"more --workers (now {ctx['workers']} of {ctx['cores']} cores)")
        if accel and not ctx.get("device_augment"):
            tips.append("--device-augment (HSV jitter and flip on the accelerator, off the workers)")
        return tips or ["a faster store: `fastfeed pack --store raw` (no decode), or fewer augmentations"]
    if part == "h2d":
        return ["pinned batches (the cpu and shm loaders pin them for a CUDA --device)",
                "--device-augment, so the copy is uint8 and nothing else crosses the bus"]
    if part == "comm":
        return ["more images per all-reduce: a larger --batch or --accum (gradients are reduced once per step)",
                "check the interconnect (NVLink / HCCS) and that every rank has its own device"]
    tips = []
    if not accel:   # --amp, --channels-last and --batch auto are for accelerators (--batch auto is an error here)
        return ["an accelerator (--device cuda or npu)", *smaller_settings(ctx.get("model", ""), ctx.get("imgsz", 0))]
    if not ctx.get("amp"):
        tips.append("--amp (bf16)")
    if not ctx.get("channels_last"):
        tips.append("--channels-last (what Tensor Cores want under AMP)")
    if not ctx.get("batch_auto"):
        tips.append("a larger batch (--batch auto: the most that fits)")
    return tips or ["a smaller --imgsz or model; the accelerator is already the limit"]


def verdict(row: dict, images_per_batch: int, ctx: dict) -> dict:
    """The verdict for a log row (`report.Meter.row()` plus memory figures): the bottleneck, each part's share
    of the step, the health figures against their limits, what to try, and a one-line text."""
    ms = {p: row.get(f"{p}_ms") or 0.0 for p in PARTS}
    step = sum(ms.values())
    shares = {p: v / step if step > 0 else 0.0 for p, v in ms.items()}
    per_image = ms["data"] / max(images_per_batch, 1)
    mem = row.get("mem_frac")
    health = [{"figure": "busy", "value": shares["compute"], "limit": f">= {BUSY_MIN:.0%}",
               "ok": shares["compute"] >= BUSY_MIN},
              {"figure": "data_ms_per_image", "value": per_image, "limit": f"<= {DATA_MS_PER_IMAGE_MAX:g}",
               "ok": per_image <= DATA_MS_PER_IMAGE_MAX},
              {"figure": "comm", "value": shares["comm"], "limit": f"<= {COMM_MAX:.0%}", "ok": shares["comm"] <= COMM_MAX}]
    if mem is not None:
        health.append({"figure": "memory", "value": mem, "limit": f"<= {MEM_MAX:.0%}", "ok": mem <= MEM_MAX})
    healthy = shares["compute"] >= BUSY_MIN or step == 0
    part = "compute" if healthy else max(("data", "h2d", "comm"), key=lambda p: shares[p])
    tips = advice(part, ctx)
    if mem is not None and mem > MEM_MAX:
        tips.append(f"memory at {mem:.0%} of the device: --grad-ckpt or a smaller --micro-batch before it runs out")
    text = f"bottleneck: {part} ({WHAT[part]} {shares[part]:.0%} of the step"
    if part == "data":
        text += f", {per_image:.1f} ms per image"
    if row.get("util_pct") is not None:
        text += f"; accelerator busy {row['util_pct']:.0f}% by NVML"
    text += ")"
    if part == "compute":   # the feed keeps up: nothing in the data path to fix
        text += ": the healthy state, the feed keeps up; to go faster: " + "; ".join(tips)
    else:
        text += "; try: " + "; ".join(tips)
    return {"bottleneck": part, "step_ms": step, "shares": shares, "ms": ms, "data_ms_per_image": per_image,
            "util_pct": row.get("util_pct"), "mem_frac": mem, "health": health, "advice": tips, "text": text}
