"""Shared fixtures: small synthetic datasets made on the fly, and the real sample data."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg

import fastfeed

REPO = Path(__file__).resolve().parents[1]
# Stores in object storage download into a shard cache: the tests' own, never the user's ~/.cache.
_SHARD_CACHE = tempfile.mkdtemp(prefix="fastfeed-test-shards-")
os.environ["FASTFEED_SHARD_CACHE"] = _SHARD_CACHE
os.environ.pop("FASTFEED_SHARD_CACHE_LIMIT", None)
os.environ.pop("FASTFEED_STORAGE_OPTIONS", None)
# One intra-op thread, here and in the processes the tests start: on a small shared machine two OpenMP threads
# spin waiting for each other while another process holds a core (a training test ran ~2.5x slower beside one
# CPU hog than with one thread). Results do not depend on it; a test that needs OpenMP's threads sets them itself.
os.environ["OMP_NUM_THREADS"] = "1"
# A suite started in the background by a script (`cmd &`) inherits Ctrl-C ignored, and so would the packs and
# workers the Ctrl-C tests start: they get Python's own handler back, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    import torch

    torch.set_num_threads(1)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SHARD_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def s3():
    """A real S3 API (moto's server) on 127.0.0.1 for the session, the environment pointed at it."""
    from s3_helpers import S3Server, moto_missing

    why = moto_missing()
    if why:
        pytest.skip(why)
    server = S3Server()
    yield server
    server.stop()


REMOTE_ENV = ("FASTFEED_SHARD_CACHE", "FASTFEED_SHARD_CACHE_LIMIT", "FASTFEED_STORAGE_OPTIONS", "FASTFEED_READ_AHEAD_SHARDS",
              "FASTFEED_PREFETCH_SHARDS",
              "LOCAL_WORLD_SIZE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@pytest.fixture
def remote_env():
    """The object-storage environment as it was, put back after a test that sets it itself (the `fastfeed` flags
    never do: they are passed as StoreOptions)."""
    saved = {k: os.environ.get(k) for k in REMOTE_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def bucket(s3):
    """A new bucket (its name) on the session's S3 server."""
    return s3.bucket()
COCO128 = Path(os.environ.get("FASTFEED_COCO128", REPO.parent / "shared" / "data" / "coco128"))


def pytest_collection_modifyitems(config, items):
    """gpu/npu tests need the device; skip them, with the reason, where there is none."""
    import torch

    has_npu = hasattr(torch, "npu") and getattr(torch.npu, "is_available", lambda: False)()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if "npu" in item.keywords and not has_npu:
            item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU with torch_npu"))


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return fastfeed.sample_path()


@pytest.fixture(scope="session")
def coco128() -> Path:
    if not (COCO128 / "annotations" / "instances_train2017.json").is_file():
        pytest.skip(f"coco128 not found at {COCO128} (set FASTFEED_COCO128)")
    return COCO128


def paint_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random RGB image (compresses like a photo, decodes to recognisable pixels)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def jpeg_bytes(img: np.ndarray, quality: int = 92) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorspace="RGB")


class CocoBuilder:
    """Write a COCO-layout dataset: root/annotations/instances_<split>.json + root/images/<split>/."""

    def __init__(self, root: Path, split: str = "train2017", categories=((1, "person"), (3, "car"), (18, "dog"))):
        self.root, self.split = root, split
        self.images_dir = root / "images" / split
        self.images_dir.mkdir(parents=True, exist_ok=True)
        (root / "annotations").mkdir(exist_ok=True)
        self.data = {"info": {}, "licenses": [], "images": [], "annotations": [],
                     "categories": [{"id": i, "name": n} for i, n in categories]}
        self._ann_id = 1

    def add_image(self, name: str, h: int = 120, w: int = 160, data: bytes | None = None, seed: int = 0,
                  boxes=(), write: bool = True, ann_size=None) -> int:
        """boxes: (category_id, [x, y, w, h]) or (category_id, bbox, iscrowd)."""
        image_id = len(self.data["images"]) + 1
        if write:
            (self.images_dir / name).write_bytes(data if data is not None else jpeg_bytes(paint_image(h, w, seed)))
        ah, aw = ann_size or (h, w)
        self.data["images"].append({"id": image_id, "file_name": name, "width": aw, "height": ah})
        for b in boxes:
            cat, bbox, crowd = (b + (0,))[:3]
            self.data["annotations"].append({"id": self._ann_id, "image_id": image_id, "category_id": cat,
                                             "bbox": list(bbox), "iscrowd": crowd, "area": 1.0})
            self._ann_id += 1
        return image_id

    def write(self) -> Path:
        (self.root / "annotations" / f"instances_{self.split}.json").write_text(json.dumps(self.data))
        return self.root


class YoloBuilder:
    """Write a YOLO-layout dataset: root/images/<split>/ + root/labels/<split>/ (+ data.yaml)."""

    def __init__(self, root: Path, split: str | None = "train", names=None):
        self.root = root
        self.images_dir = root / "images" / split if split else root / "images"
        self.labels_dir = root / "labels" / split if split else root / "labels"
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.labels_dir.mkdir(parents=True, exist_ok=True)
        if names is not None:
            (root / "data.yaml").write_text("names:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(names)))

    def add(self, stem: str, lines=None, h: int = 100, w: int = 140, seed: int = 0, image: bool = True,
            ext: str = ".jpg", data: bytes | None = None):
        if image:
            (self.images_dir / f"{stem}{ext}").write_bytes(data if data is not None else jpeg_bytes(paint_image(h, w, seed)))
        if lines is not None:
            (self.labels_dir / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        return self


def roboflow_export(root: Path, names=("cat", "dog"), splits=(("train", 4), ("valid", 2)), yaml: bool = True) -> Path:
    """A YOLO export laid out as Roboflow writes it: <split>/images/ + <split>/labels/ per split, and a data.yaml at
    the top whose splits say `../<split>/images` (resolved inside the export, as Ultralytics does). Image k of a
    split has one box of class k % len(names)."""
    for split, n in splits:
        for k in range(n):
            (root / split / "images").mkdir(parents=True, exist_ok=True)
            (root / split / "labels").mkdir(parents=True, exist_ok=True)
            (root / split / "images" / f"{split}_{k}.jpg").write_bytes(jpeg_bytes(paint_image(80, 100, seed=k)))
            (root / split / "labels" / f"{split}_{k}.txt").write_text(f"{k % len(names)} 0.5 0.5 0.3 0.4\n")
    if yaml:
        keys = {"train": "train", "valid": "val", "test": "test"}
        (root / "data.yaml").write_text("".join(f"{keys.get(s, s)}: ../{s}/images\n" for s, _ in splits)
                                        + f"nc: {len(names)}\nnames: {list(names)}\n"
                                        + "roboflow:\n  workspace: w\n  project: p\n  version: 1\n")
    return root


@pytest.fixture
def coco_builder(tmp_path):
    return CocoBuilder(tmp_path / "coco")


@pytest.fixture
def yolo_builder(tmp_path):
    return lambda **kw: YoloBuilder(tmp_path / "yolo", **kw)


# Every container Ultralytics lists (plus .jpe, .pfm): extension -> how `image_bytes` encodes it.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "jpe", "mpo", "png", "bmp", "tif", "tiff", "webp", "jp2", "pfm",
                    "avif", "heic", "heif", "dng")
_PIL_FORMATS = {"png": "PNG", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF", "webp": "WEBP", "jp2": "JPEG2000",
                "avif": "AVIF", "gif": "GIF", "ppm": "PPM"}


def dng_bytes(h: int = 96, w: int = 128, seed: int = 0) -> bytes:
    """A minimal 12-bit Bayer DNG (pidng); skips the test when pidng is not installed."""
    import tempfile

    core = pytest.importorskip("pidng.core")
    from pidng.defs import CalibrationIlluminant, CFAPattern, DNGVersion, PhotometricInterpretation

    raw = np.random.default_rng(seed).integers(0, 4095, (h, w)).astype(np.uint16)
    t = core.DNGTags()
    for tag, value in ((core.Tag.ImageWidth, w), (core.Tag.ImageLength, h), (core.Tag.TileWidth, w),
                       (core.Tag.TileLength, h), (core.Tag.SamplesPerPixel, 1), (core.Tag.BitsPerSample, 12),
                       (core.Tag.PhotometricInterpretation, PhotometricInterpretation.Color_Filter_Array),
                       (core.Tag.CFARepeatPatternDim, [2, 2]), (core.Tag.CFAPattern, CFAPattern.GBRG),
                       (core.Tag.BlackLevel, 0), (core.Tag.WhiteLevel, 4095),
                       (core.Tag.ColorMatrix1, [[1, 1], [0, 1], [0, 1], [0, 1], [1, 1], [0, 1], [0, 1], [0, 1], [1, 1]]),
                       (core.Tag.CalibrationIlluminant1, CalibrationIlluminant.D65),
                       (core.Tag.AsShotNeutral, [[1, 1], [1, 1], [1, 1]]), (core.Tag.Make, "fastfeed"),
                       (core.Tag.Model, "test"), (core.Tag.DNGVersion, DNGVersion.V1_4),
                       (core.Tag.DNGBackwardVersion, DNGVersion.V1_2)):
        t.set(tag, value)
    with tempfile.TemporaryDirectory() as d:
        r = core.RAW2DNG()
        r.options(t, path=d, compress=False)
        r.convert(raw, filename="raw")
        return (Path(d) / "raw.dng").read_bytes()


def image_bytes(img: np.ndarray, ext: str) -> bytes:
    """RGB uint8 `img` encoded as a file with extension `ext` would hold it (lossless where the format
    allows). A DNG holds Bayer noise of the same size, not `img`. Skips the test when no installed
    encoder writes `ext`."""
    from PIL import Image

    pim = Image.fromarray(img)
    buf = io.BytesIO()
    if ext in ("jpg", "jpeg", "jpe"):
        return jpeg_bytes(img)
    if ext == "mpo":  # two JPEG frames: what stereo and some phone cameras write
        pim.save(buf, "MPO", save_all=True, append_images=[pim.transpose(Image.Transpose.FLIP_LEFT_RIGHT)], quality=92)
    elif ext == "pfm":
        return cv2.imencode(".pfm", cv2.cvtColor(img, cv2.COLOR_RGB2BGR).astype(np.float32) / 255)[1].tobytes()
    elif ext in ("heic", "heif"):
        pytest.importorskip("pillow_heif").register_heif_opener()
        pim.save(buf, "HEIF", quality=-1)
    elif ext == "dng":
        return dng_bytes(*img.shape[:2])
    elif ext == "webp":
        pim.save(buf, "WEBP", lossless=True)
    elif ext == "avif":
        pim.save(buf, "AVIF", quality=100)
    else:
        pim.save(buf, _PIL_FORMATS[ext])
    return buf.getvalue()


def png_claiming(h: int, w: int) -> bytes:
    """A small PNG whose IHDR claims h x w (a decompression bomb's header; the data does not match)."""
    import struct
    import zlib

    data = bytearray(cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes())
    data[16:24] = struct.pack(">II", w, h)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)
