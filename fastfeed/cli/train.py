"""`fastfeed train`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail

_EXAMPLES = """\
examples:
  fastfeed train --data sample.ff --model yolov3-tiny --imgsz 320 --batch 8 --epochs 3
  fastfeed train --data coco.ff --val val.ff --model yolov3 --imgsz 640 --batch 16 --device cuda --amp
  fastfeed train --data coco.ff --out runs/exp --resume                 # continue runs/exp/last.pt
  fastfeed train --val val.ff --eval-only --weights runs/exp/best.pt     # COCO mAP of a checkpoint
  torchrun --nproc_per_node 4 -m fastfeed train --data coco.ff --device cuda --batch 16   # 4 GPUs, 64/step

The loss is a sum over images; lr and weight decay are tuned for 64 images per optimizer step, and
--accum defaults to what reaches 64 (batch x processes x accum). A run directory holds last.pt,
best.pt (with --val), and metrics.jsonl (one JSON line per log interval and evaluation).
Checkpoints load with torch.load(weights_only=True)."""


HELP = "train the bundled YOLOv3 / YOLOv3-tiny on a store (and evaluate COCO mAP)"

def _amp_arg(value: str) -> str:
    if value not in ("bf16", "fp16"):
        raise argparse.ArgumentTypeError(f"expected bf16 or fp16, got {value!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES,
        description="Train YOLOv3 or YOLOv3-tiny on a store made by `fastfeed pack`, fed by a fastfeed loader and\n"
                    "the device prefetcher. Logs loss terms, lr, images/s, and per step the time spent waiting\n"
                    "for data against the time computing; evaluates COCO mAP@0.5 and mAP@0.5:0.95 on --val.")
    d = p.add_argument_group("data")
    d.add_argument("--data", type=Path, help="training store (required unless --eval-only)")
    d.add_argument("--val", type=Path, help="store to evaluate after each epoch (COCO mAP with pycocotools)")
    d.add_argument("--loader", default="cpu", help="fastfeed loader feeding the training (default cpu)")
    d.add_argument("--workers", type=int, help="loader worker processes (default: one per core, up to 8)")
    d.add_argument("--imgsz", type=int, default=640, help="training and evaluation size, a multiple of 32 (default 640)")
    d.add_argument("--no-augment", dest="augment", action="store_false",
                   help="train on letterboxed images without mosaic/affine/HSV/flip (debugging, overfitting)")
    d.add_argument("--close-mosaic", type=int, default=10, help="train the last N epochs without mosaic (default 10)")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", default="yolov3", choices=("yolov3", "yolov3-tiny"), help="network (default yolov3)")
    m.add_argument("--batch", type=int, default=16, help="images per micro-batch and process (default 16)")
    m.add_argument("--accum", type=int, help="micro-batches per optimizer step (default: reach 64 images per step)")
    m.add_argument("--epochs", type=int, default=300, help="epochs; the LR schedule spans them (default 300)")
    m.add_argument("--max-steps", type=int, metavar="N", help="stop after N optimizer steps (schedule still spans --epochs)")
    m.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"), help="SGD with Nesterov momentum, or AdamW")
    m.add_argument("--lr", type=float, help="initial lr (default 0.01 for SGD, 0.001 for AdamW)")
    m.add_argument("--lrf", type=float, default=0.01, help="final lr as a fraction of --lr (default 0.01)")
    m.add_argument("--schedule", default="cosine", choices=("cosine", "linear"), help="LR decay (default cosine)")
    m.add_argument("--weight-decay", type=float, default=5e-4, help="per 64 images, not on norms or biases (default 5e-4)")
    m.add_argument("--warmup-epochs", type=float, default=3.0, help="lr/momentum warmup length in epochs (default 3)")
    m.add_argument("--no-ema", dest="ema", action="store_false", help="evaluate and save the raw weights, no EMA")
    m.add_argument("--seed", type=int, default=0, help="seed for weights and the loader (default 0)")
    r = p.add_argument_group("device and memory")
    r.add_argument("--device", default="cpu", help="cpu, cuda[:N] or npu[:N] (torchrun: each process takes its local rank)")
    r.add_argument("--amp", nargs="?", const="bf16", type=_amp_arg, metavar="bf16|fp16",
                   help="mixed precision: bf16 (default when given) or fp16 with loss scaling; weights and norms stay fp32")
    r.add_argument("--grad-ckpt", action="store_true",
                   help="recompute backbone activations in backward: less memory, ~20-30%% more compute")
    o = p.add_argument_group("run directory, checkpoints, evaluation")
    o.add_argument("--out", type=Path, default=Path("runs/train"), help="run directory (default runs/train)")
    o.add_argument("--resume", nargs="?", const=True, metavar="CKPT",
                   help="continue from OUT/last.pt (or CKPT): weights, EMA, optimizer, scaler, schedule, epoch, step")
    o.add_argument("--weights", type=Path, metavar="CKPT", help="start from (or, with --eval-only, evaluate) these weights")
    o.add_argument("--eval-only", action="store_true", help="evaluate --weights on --val and exit")
    o.add_argument("--eval-every", type=int, default=1, help="epochs between evaluations on --val (default 1)")
    o.add_argument("--conf", type=float, default=0.001, help="evaluation score threshold (default 0.001)")
    o.add_argument("--iou", type=float, default=0.6, help="evaluation NMS IoU threshold (default 0.6)")
    o.add_argument("--log-every", type=int, default=10, help="optimizer steps between log lines (default 10)")
    o.add_argument("--json", action="store_true", help="print the final summary as JSON")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _format(s: dict) -> str:
    if s["mode"] == "eval":
        return (f"{s['model']} {s['weights']} on {s['val']} at {s['imgsz']}: mAP@0.5 {s['map50']:.4f}, "
                f"mAP@0.5:0.95 {s['map']:.4f} ({s['images']} images, {s['detections']} detections)\n")
    lines = [f"{s['model']} ({s['params'] / 1e6:.1f} M parameters, {s['gflops']:.1f} GFLOPs at {s['imgsz']}) on "
             f"{s['device']} x {s['world_size']}: {s['step']} steps of {s['images_per_step']} images, "
             f"epoch {s['epoch']}, {s['wall_s']:.1f} s",
             f"  {s['images_per_s']:.1f} images/s; per micro-batch {s['data_ms']:.1f} ms waiting for data, "
             f"{s['compute_ms']:.1f} ms computing ({s['data_wait_frac']:.1%} waiting)"
             + (f"; final loss {s['loss']:.4f}" if s.get("loss") is not None else "")]
    if s.get("mem_peak_mb") is not None:
        lines.append(f"  peak device memory {s['mem_peak_mb']:.0f} MiB allocated, {s['mem_reserved_mb']:.0f} MiB reserved")
    if s.get("map50") is not None:
        lines.append(f"  mAP@0.5 {s['map50']:.4f}, mAP@0.5:0.95 {s['map']:.4f} (best {s['best_map']:.4f})")
    lines.append(f"  checkpoint {s['last_checkpoint']}, metrics {Path(s['run_dir']) / 'metrics.jsonl'}")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    import os

    from ..devices import DeviceError
    from ..store.format import FormatError
    from ..train import CheckpointError, TrainConfig, TrainError, TrainingDiverged, train

    try:
        cfg = TrainConfig(data=args.data, val=args.val, loader=args.loader, model=args.model, imgsz=args.imgsz,
                          batch=args.batch, epochs=args.epochs, workers=args.workers, device=args.device, amp=args.amp,
                          grad_ckpt=args.grad_ckpt, accum=args.accum, optimizer=args.optimizer, lr=args.lr,
                          lrf=args.lrf, schedule=args.schedule, weight_decay=args.weight_decay,
                          warmup_epochs=args.warmup_epochs, ema=args.ema, augment=args.augment,
                          close_mosaic=args.close_mosaic, seed=args.seed, out=args.out, resume=args.resume or False,
                          eval_only=args.eval_only, weights=args.weights, log_every=args.log_every,
                          max_steps=args.max_steps, eval_every=args.eval_every, conf_thres=args.conf,
                          iou_thres=args.iou, progress=not args.quiet)
        for flag, path in (("--data", cfg.data), ("--val", cfg.val)):
            if path is not None and not path.exists():
                return fail(f"{flag} {path} does not exist (make a store with `fastfeed pack SRC -o OUT`)")
        res = train(cfg)
    except TrainingDiverged as e:
        return fail(str(e))
    except (FormatError, CheckpointError) as e:   # ValueErrors too, but not usage errors
        return fail(str(e))
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    except (TrainError, DeviceError, ImportError) as e:
        return fail(str(e))
    if int(os.environ.get("RANK", 0)) != 0:   # under torchrun, rank 0 speaks for the run
        return EXIT_OK
    print(json.dumps(res.summary, indent=1) if args.json else _format(res.summary), end="\n" if args.json else "")
    return EXIT_OK if res.summary.get("mode") else EXIT_FAIL
