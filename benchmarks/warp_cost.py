"""What OpenCV's geometry kernels cost a pixel, on one thread: the floor under any CPU rendering of a warp.

    python benchmarks/warp_cost.py [--images 16] [--calls 50] [--rounds 5]

fastfeed's mosaic draws an axis-aligned tile with `cv2.resize` and a rotated, sheared or perspective one with
`cv2.warpAffine`/`cv2.warpPerspective` (`augment/paste.py`); Ultralytics warps every sample. Each coco128 image
(decoded, its long side at 640) is drawn into a 640x480 output by each kernel below, in 3 and 4 channels, with a
constant border and (the warps) a transparent one: CPU time per call, the fastest of --rounds rounds of --calls
calls over the images, `cv2.setNumThreads(1)`. Printed: ms a call, ns an output pixel, and each kernel's cost over
`resize` in 3 channels (the baseline, run in this process). The two conversions a 4-channel route adds
(`cvtColor` 3 -> 4 of a source, 4 -> 3 of an output) are timed too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, machine  # noqa: E402

W, H = 640, 480


def best_ms(call, items, calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for i in range(calls):
            call(items[i % len(items)])
        best = min(best, (time.process_time() - t0) / calls * 1e3)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cv2.setNumThreads(1)
    files = sorted((default_source() / "images").rglob("*.jpg"))[:args.images]
    imgs3 = []
    for f in files:
        img = cv2.imread(str(f))
        r = 640 / max(img.shape[:2])
        imgs3.append(cv2.resize(img, (round(img.shape[1] * r), round(img.shape[0] * r))))
    imgs4 = [cv2.cvtColor(i, cv2.COLOR_BGR2BGRA) for i in imgs3]
    # a mosaic tile's map as fastfeed's plan draws one: scale 1.1, 5 degrees, perspective 0.0005 about the centre
    c = np.array([[1, 0, -W / 2], [0, 1, -H / 2], [0, 0, 1.0]])
    a = np.deg2rad(5)
    rs = np.array([[1.1 * np.cos(a), -1.1 * np.sin(a), 0], [1.1 * np.sin(a), 1.1 * np.cos(a), 0], [0, 0, 1.0]])
    p = np.array([[1, 0, 0], [0, 1, 0], [0.0003, 0.0002, 1.0]])
    t = np.array([[1, 0, W / 2], [0, 1, H / 2], [0, 0, 1.0]])
    persp, affine = t @ p @ rs @ c, (t @ rs @ c)[:2]
    fill = (114, 114, 114, 114)
    rows = []
    for ch, imgs in ((3, imgs3), (4, imgs4)):
        dst = np.zeros((H, W, ch), np.uint8)
        kernels = {
            "resize": lambda i, dst=dst: cv2.resize(i, (W, H), dst=dst, interpolation=cv2.INTER_LINEAR),
            "warpAffine, constant": lambda i, dst=dst: cv2.warpAffine(i, affine, (W, H), dst=dst, borderValue=fill),
            "warpPerspective, constant": lambda i, dst=dst: cv2.warpPerspective(i, persp, (W, H), dst=dst, borderValue=fill),
            "warpAffine, transparent": lambda i, dst=dst: cv2.warpAffine(i, affine, (W, H), dst=dst,
                                                                borderMode=cv2.BORDER_TRANSPARENT),
            "warpPerspective, transparent": lambda i, dst=dst: cv2.warpPerspective(i, persp, (W, H), dst=dst,
                                                                          borderMode=cv2.BORDER_TRANSPARENT),
        }
        rows += [(f"{name}, {ch} channels", best_ms(k, imgs, args.calls, args.rounds)) for name, k in kernels.items()]
    out4 = np.zeros((H, W, 4), np.uint8)
    out3 = np.zeros((H, W, 3), np.uint8)
    rows.append(("cvtColor 3 -> 4 (a source)", best_ms(lambda i: cv2.cvtColor(i, cv2.COLOR_BGR2BGRA), imgs3,
                                                         args.calls, args.rounds)))
    rows.append(("cvtColor 4 -> 3 (an output)", best_ms(lambda i: cv2.cvtColor(out4, cv2.COLOR_BGRA2BGR, dst=out3),
                                                          imgs3, args.calls, args.rounds)))
    base = rows[0][1]
    print(f"{machine()}\n{len(files)} coco128 images at 640 into {W}x{H}, one thread, fastest of {args.rounds} rounds "
          f"of {args.calls} calls, CPU time\n")
    print("| kernel | ms a call | ns an output pixel | over resize, 3 channels |")
    print("|---|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.3f} | {ms * 1e6 / (W * H):.2f} | {ms / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
