#!/usr/bin/env bash
# The first hour with fastfeed, as docs/first_hour.md walks through it: the bundled sample (pack, inspect,
# verify, bench, a batch drawn, a short `fastfeed train`), then a YOLO export laid out like Roboflow's (made
# from the sample here; give your own with EXPORT=path/to/export), packed from its data.yaml, and Ultralytics
# trained on it through FastfeedTrainer, which prints the feed's data-wait share every epoch.
#
#   bash tools/first_hour.sh [WORKDIR]        # default WORKDIR: ./first-hour (created; must not exist)
#
# Needs fastfeed installed with its Ultralytics extra (pip install -e '.[ultralytics]'): the `fastfeed`
# command on PATH and `python` importing fastfeed and ultralytics. Small settings throughout (imgsz 64..160,
# one or two epochs) so that it runs in a few minutes on a laptop CPU; a real run uses your sizes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${1:-first-hour}"
py="${PYTHON:-python}"
if [ -e "$work" ]; then echo "first_hour: $work already exists; give another WORKDIR" >&2; exit 2; fi
mkdir -p "$work"
cd "$work"
step() { printf '\n### %s\n' "$*"; }

step "1. pack the bundled sample, look at it, check it"
fastfeed pack -o sample.ff --quiet
fastfeed inspect sample.ff
fastfeed verify sample.ff --decode --quiet

step "2. how fast each loader serves it, and a batch drawn with its boxes"
fastfeed bench --data sample.ff --loader cpu --seconds 2 --imgsz 160 --batch 4 --workers 1
"$py" "$here/show_batch.py" --data sample.ff -o batch.png --imgsz 160 --batch 4

step "3. a short run of the bundled trainer: the plan, the log lines, the verdict"
fastfeed train --data sample.ff --val sample.ff --model yolov3-tiny --imgsz 64 --batch 8 --epochs 2 \
               --close-mosaic 1 --workers 0 --log-every 1 --out runs/sample

step "4. a YOLO export laid out like Roboflow's: train/ valid/ + data.yaml"
if [ -n "${EXPORT:-}" ]; then
  export_dir="$EXPORT"
else
  "$py" "$here/sample_export.py" export --layout roboflow
  export_dir=export
fi
cat "$export_dir/data.yaml"
fastfeed pack "$export_dir/data.yaml" -o export-train.ff --quiet          # data.yaml's train: (--split val: valid/)
fastfeed inspect export-train.ff

step "5. Ultralytics trained on it through FastfeedTrainer: every epoch says the feed's data-wait share"
EXPORT_DIR="$export_dir" YOLO_OFFLINE="${YOLO_OFFLINE:-1}" "$py" - <<'EOF'
import os

from ultralytics import YOLO

from fastfeed.integrations.ultralytics import FastfeedTrainer

model = YOLO("yolov8n.yaml")
model.train(data=os.path.join(os.environ["EXPORT_DIR"], "data.yaml"), trainer=FastfeedTrainer, epochs=2,
            imgsz=64, batch=4, workers=0, device="cpu", plots=False, project=os.path.abspath("runs"), name="export",
            exist_ok=True)
print(f"fastfeed's per-epoch figures: {model.trainer.save_dir / 'fastfeed.csv'}")
print(open(model.trainer.save_dir / "fastfeed.csv").read(), end="")
EOF
