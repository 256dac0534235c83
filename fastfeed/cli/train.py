"""`fastfeed train`. Defaults and choices come from TrainConfig and the registries (MODELS, the loader
registry), not from here."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..train.config import AMPS, DEFAULT_IMGSZ, DEFAULT_LR, MODELS, OPTIMIZERS, SCHEDULES, TrainConfig
from .common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    add_remote_args,
    config_of,
    defaults,
    fail,
    int_or_auto,
    progress_lines,
    store_options,
    store_path,
)

D = defaults(TrainConfig)   # the library's defaults are the command's

_EXAMPLES = """\
examples:
  fastfeed train --data sample.ff --model yolov3-tiny --imgsz 320 --batch 8 --epochs 3 --close-mosaic 1
  fastfeed train --data coco.ff --val val.ff --model yolov3 --imgsz 640 --batch 16 --device cuda --amp
  fastfeed train --data coco.ff --device cuda --amp --channels-last --batch auto --multi-scale
  fastfeed train --data coco.ff --out runs/exp --resume                 # continue runs/exp/last.pt
  fastfeed train --data coco.ff --out runs/exp --resume auto --save-every-min 10   # spot instance: see below
  fastfeed train --data mine.ff --weights runs/exp/best.pt --freeze-bn --hyp hyp.yaml   # fine-tune
  fastfeed train --val val.ff --eval-only --weights runs/exp/best.pt     # COCO mAP of a checkpoint
  torchrun --nproc_per_node 4 -m fastfeed train --data coco.ff --device npu --sync-bn --multi-scale   # 4 NPUs

The loss is a sum over images; lr and weight decay are tuned for 64 images per optimizer step, and
--accum defaults to what reaches 64 (batch x processes x accum). A run directory holds last.pt,
best.pt (with --val), and metrics.jsonl (one JSON line per log interval and evaluation); a new run in a
directory that holds one needs --force. --resume and --eval-only use the checkpoint's --imgsz unless given.
Checkpoints load with torch.load(weights_only=True). The summary names the step's bottleneck (data,
host->device copy, compute, DDP communication) against health thresholds for accelerator busy time,
memory, data wait per image and DDP sync share, and says what to try. See docs/training.md.

Preemption: SIGTERM, SIGUSR1 (SLURM --signal=USR1@120) or a first Ctrl-C finish the step in flight,
write last.pt mid-epoch and exit with status 75 (EX_TEMPFAIL); --resume continues with the next batch,
as if uninterrupted. Under torchrun a signal to any rank stops every rank after the same step. A second
Ctrl-C aborts at once (status 130; last.pt stays the previous one). --save-every-min N also writes
last.pt every N minutes, for kills that give no notice (kill -9, a lost node). A store in object storage
still unreachable after its retries: last.pt at the last finished step, then exit 1 naming --resume."""


HELP = "train the bundled YOLOv3 / YOLOv3-tiny on a store (and evaluate COCO mAP)"


class _Loaders:
    """The loader registry's names as argparse choices, read only when --loader is given or help printed
    (the registry imports torch; `fastfeed --version` should not). `in` iterates them too."""

    def __iter__(self):
        from ..loaders import list_loaders

        return iter(list_loaders())


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES,
        description="Train YOLOv3 or YOLOv3-tiny on a store made by `fastfeed pack`, fed by a fastfeed loader and\n"
                    "the device prefetcher. Logs loss terms, lr, images/s, and per step the time spent waiting\n"
                    "for data, copying to the device, computing and in DDP all-reduce; evaluates COCO mAP@0.5\n"
                    "and mAP@0.5:0.95 on --val; ends with a bottleneck verdict and what to try.")
    d = p.add_argument_group("data")
    d.add_argument("--data", type=store_path,
                   help="training store, a folder or its URL (s3://bucket/coco.ff; required unless --eval-only); a "
                        "segment, pose or OBB store trains on its boxes alone (the models detect)")
    d.add_argument("--val", type=store_path,
                   help="store to evaluate after each epoch (COCO mAP with pycocotools; default: none, no evaluation "
                        "and no best.pt)")
    d.add_argument("--loader", default=D["loader"], choices=_Loaders(), metavar="NAME",
                   help="fastfeed loader feeding the training (`fastfeed loaders` lists them; default %(default)s)")
    d.add_argument("--workers", type=int, help="loader worker processes (default: one per core, up to 8)")
    d.add_argument("--imgsz", type=int,
                   help=f"training and evaluation size, a multiple of 32 (default {DEFAULT_IMGSZ}; with --resume or "
                        "--eval-only: the size the checkpoint was trained at)")
    d.add_argument("--hyp", type=Path, metavar="FILE",
                   help="YAML of augmentation gains (AugmentHyp's fields: mosaic, mixup, degrees, translate, scale, "
                        "shear, fliplr, flipud, hsv_h, hsv_s, hsv_v, ...); unknown keys are an error (default: "
                        "AugmentHyp's defaults)")
    d.add_argument("--device-augment", action="store_true",
                   help="HSV jitter and horizontal flip on the device, after the copy, instead of in the workers")
    d.add_argument("--no-augment", dest="augment", action="store_false",
                   help="train on letterboxed images without mosaic/affine/HSV/flip (debugging, overfitting)")
    d.add_argument("--close-mosaic", type=int, default=D["close_mosaic"],
                   help="train the last N epochs without mosaic (default %(default)s)")
    d.add_argument("--multi-scale", action="store_true",
                   help="each optimizer step at a size drawn from 0.5-1.5 x --imgsz (multiples of 32), resized on "
                        "the device; evaluation stays at --imgsz")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", default=D["model"], choices=MODELS, help="network (default %(default)s)")
    m.add_argument("--batch", type=int_or_auto("a number of images"), default=D["batch"], metavar="N|auto",
                   help="images per loader batch and process (default %(default)s); 'auto': the largest micro-batch "
                        "whose step fits the accelerator's memory with a margin, measured at the start")
    m.add_argument("--micro-batch", type=int, metavar="N",
                   help="images per forward/backward: each batch is split into micro-batches of N (default: "
                        "--batch). Halved automatically, at most twice, when the device runs out of memory")
    m.add_argument("--accum", type=int, help="loader batches per optimizer step (default: reach 64 images per step)")
    m.add_argument("--epochs", type=int, default=D["epochs"], help="epochs; the LR schedule spans them (default %(default)s)")
    m.add_argument("--max-steps", type=int, metavar="N",
                   help="stop after N optimizer steps (schedule still spans --epochs; default: none, every epoch)")
    m.add_argument("--optimizer", default=D["optimizer"], choices=OPTIMIZERS,
                   help="SGD with Nesterov momentum, or AdamW (default %(default)s)")
    m.add_argument("--lr", type=float, help="initial lr (default " + ", ".join(f"{v:g} for {k}" for k, v in DEFAULT_LR.items())
                   + ")")
    m.add_argument("--lrf", type=float, default=D["lrf"], help="final lr as a fraction of --lr (default %(default)s)")
    m.add_argument("--schedule", default=D["schedule"], choices=SCHEDULES, help="LR decay (default %(default)s)")
    m.add_argument("--weight-decay", type=float, default=D["weight_decay"],
                   help="per 64 images, not on norms or biases (default %(default)s)")
    m.add_argument("--warmup-epochs", type=float, default=D["warmup_epochs"],
                   help="lr/momentum warmup length in epochs (default %(default)s)")
    m.add_argument("--no-ema", dest="ema", action="store_false", help="evaluate and save the raw weights, no EMA")
    m.add_argument("--sync-bn", action="store_true",
                   help="SyncBatchNorm: BatchNorm statistics over every DDP process's micro-batch (CUDA/NPU only)")
    m.add_argument("--freeze-bn", action="store_true",
                   help="BatchNorm layers keep their running statistics and affine weights (fine-tuning --weights)")
    m.add_argument("--seed", type=int, default=D["seed"], help="seed for weights, loader and --multi-scale (default %(default)s)")
    r = p.add_argument_group("device and memory")
    r.add_argument("--device", default=D["device"],
                   help="cpu, cuda[:N] or npu[:N] (torchrun: each process takes its local rank; default %(default)s)")
    r.add_argument("--amp", nargs="?", const=AMPS[0], choices=AMPS, metavar="|".join(AMPS),
                   help="mixed precision: bf16 (default when given) or fp16 with loss scaling; weights and norms stay fp32")
    r.add_argument("--channels-last", action="store_true",
                   help="model and batches in channels-last layout (NHWC: what Tensor Cores want under AMP; "
                        "NC1HWC0 through torch_npu on Ascend)")
    r.add_argument("--grad-ckpt", action="store_true",
                   help="recompute backbone activations in backward: less memory, ~20-30%% more compute")
    o = p.add_argument_group("run directory, checkpoints, evaluation")
    o.add_argument("--out", type=Path, default=D["out"], help="run directory (default %(default)s)")
    o.add_argument("--resume", nargs="?", const=True, default=D["resume"], metavar="CKPT|auto",
                   help="continue from OUT/last.pt (or CKPT): weights, EMA, optimizer, scaler, schedule, epoch, step, "
                        "the loader's position; 'auto': if OUT/last.pt exists, else start (one command for a job that "
                        "may be preempted and restarted); default: off, a new run")
    o.add_argument("--force", action="store_true",
                   help="start a new run in an --out that already holds one: its metrics.jsonl and best.pt are removed "
                        "once the run is set up, its last.pt replaced at the first checkpoint (without --force or "
                        "--resume such an --out is refused)")
    o.add_argument("--save-every-min", type=float, metavar="N",
                   help="also write last.pt every N minutes, mid-epoch, so a kill with no notice loses at most N "
                        "minutes (each write's time is in metrics.jsonl); default: off, last.pt at each epoch's end and on "
                        "a stop signal")
    o.add_argument("--weights", type=Path, metavar="CKPT",
                   help="start from (or, with --eval-only, evaluate) these weights (default: none, newly initialised)")
    o.add_argument("--eval-only", action="store_true", help="evaluate --weights on --val and exit")
    o.add_argument("--eval-every", type=int, default=D["eval_every"], help="epochs between evaluations on --val (default %(default)s)")
    o.add_argument("--conf", dest="conf_thres", type=float, default=D["conf_thres"],
                   help="evaluation score threshold (default %(default)s)")
    o.add_argument("--iou", dest="iou_thres", type=float, default=D["iou_thres"],
                   help="evaluation NMS IoU threshold (default %(default)s)")
    o.add_argument("--log-every", type=int, default=D["log_every"], help="optimizer steps between log lines (default %(default)s)")
    o.add_argument("--json", action="store_true", help="print the final summary as JSON (with `bottleneck` and its figures)")
    o.add_argument("--quiet", dest="progress", action="store_false",
                   help="no progress bar (there is none when stderr is not a terminal: the log lines are plain there)")
    add_remote_args(p)
    p.set_defaults(func=run)


def _format(s: dict) -> str:
    if s["mode"] == "eval":
        return (f"{s['model']} {s['weights']} on {s['val']} at {s['imgsz']}: mAP@0.5 {s['map50']:.4f}, "
                f"mAP@0.5:0.95 {s['map']:.4f} ({s['images']} images, {s['detections']} detections)\n")
    if s["mode"] == "finished":
        return _finished(s)
    micro = "" if s["micro_batch"] == s["batch"] else f" in micro-batches of {s['micro_batch']}"
    lines = [f"{s['model']} ({s['params'] / 1e6:.1f} M parameters, {s['gflops']:.1f} GFLOPs at {s['imgsz']}) on "
             f"{s['device']} x {s['world_size']}: step {s['step']}, epochs done {s['epoch']}/{s['epochs']} (steps of up "
             f"to {s['images_per_step']} images{micro}); {s['images']} images trained"
             f"{' since the resume' if s.get('resumed') else ''} in {s['wall_s']:.1f} s",
             f"  {s['images_per_s']:.1f} images/s; per batch {s['data_ms']:.1f} ms waiting for data, {s['h2d_ms']:.1f} ms "
             f"for copies, {s['compute_ms']:.1f} ms computing, {s['comm_ms']:.1f} ms in all-reduce "
             f"({s['data_wait_frac']:.1%} waiting for data)"
             + (f"; final loss {s['loss']:.4f}" if s.get("loss") is not None else "")]
    if s.get("mem_peak_mb") is not None:
        lines.append(f"  device memory: peak {s['mem_peak_mb']:.0f} MiB allocated, {s['mem_peak_reserved_mb']:.0f} MiB "
                     f"reserved of {s['mem_total_mb']:.0f} MiB ({s['mem_frac']:.0%})")
    if s.get("map50") is not None:
        lines.append(f"  mAP@0.5 {s['map50']:.4f}, mAP@0.5:0.95 {s['map']:.4f} (best {s['best_map']:.4f})")
    lines.append(f"  {s['bottleneck']['text']}")
    lines.append(f"  checkpoint {s['last_checkpoint']}, metrics {Path(s['run_dir']) / 'metrics.jsonl'}")
    if s.get("stopped_by"):
        lines.append(f"  stopped by {s['stopped_by']} after step {s['step']}: continue with --resume")
    return "\n".join(lines) + "\n"


def _finished(s: dict) -> str:
    """A resumed run that had nothing left to do: what it did and where its weights are."""
    why = (f"all {s['epochs']} epochs done" if s["epoch"] >= s["epochs"]
           else f"--max-steps {s['max_steps']} reached at epoch {s['epoch'] + 1}/{s['epochs']}")
    best = ("no evaluation (train with --val for best.pt)" if s["best_map"] is None else
            f"best mAP@0.5:0.95 {s['best_map']:.4f}" + (f" ({s['best_checkpoint']})" if s["best_checkpoint"] else ""))
    return (f"{s['run_dir']} is a finished run: {why}, step {s['step']}; {best}; last weights {s['last_checkpoint']}.\n"
            f"  Nothing to train. To train longer, --resume with more --epochs (or a larger --max-steps); to evaluate: "
            f"fastfeed train --eval-only --weights {s['best_checkpoint'] or s['last_checkpoint']} --val VAL.ff\n")


def run(args) -> int:
    from ..devices import DeviceError
    from ..store.format import FormatError
    from ..train import CheckpointError, TrainError, train  # TrainError: TrainingDiverged too

    try:
        cfg = config_of(TrainConfig, args, store_options=store_options(args))   # every flag is a field of that name
        for flag, path in (("--data", cfg.data), ("--val", cfg.val)):
            if isinstance(path, Path) and not path.exists():
                return fail(f"{flag} {path} does not exist (make a store with `fastfeed pack SRC -o OUT`)")
        with progress_lines(getattr(args, "verbose", False)):   # the log lines, mAP lines and warnings; pycocotools' tables only with -v
            res = train(cfg)
    except (FormatError, CheckpointError) as e:   # ValueErrors too, but not usage errors
        return fail(e)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    except (TrainError, DeviceError, ImportError) as e:
        return fail(str(e))
    code = EXIT_PREEMPTED if res.summary.get("stopped_by") else EXIT_OK if res.summary.get("mode") else EXIT_FAIL
    if int(os.environ.get("RANK", 0)) != 0:   # under torchrun, rank 0 speaks for the run
        return code
    print(json.dumps(res.summary, indent=1) if args.json else _format(res.summary), end="\n" if args.json else "")
    return code
