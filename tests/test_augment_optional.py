"""The augmentations not every renderer draws (`loaders.renders.OPTIONAL`): each drawn in the one plan, rendered by
the cpu and shm loaders with every task's geometry following its pixels, and refused by name by a loader whose
renderer does not declare it. Their statistics against Ultralytics': tests/integrations/test_ultralytics_augment.py."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
from task_stores import (
    HYP,
    batches,
    check_keypoints_on_dots,
    check_masks_on_paint,
    check_rboxes_on_paint,
    copy,
    make_task_store,
    make_task_stores,
)

from fastfeed.augment import AffineDraw, AugmentHyp, affine_matrix, batch_rng, draw_affine, draw_sample
from fastfeed.loaders import LoaderConfig, UnsupportedAugmentation, UnsupportedTask, create_loader
from fastfeed.loaders.renders import CPU, DALI, DEVICE, OPTIONAL, asked, renderer

S = 128
STILL = AugmentHyp(mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)   # no motion


@pytest.fixture(scope="module")
def segment(tmp_path_factory):
    return make_task_store(tmp_path_factory.mktemp("optional"), "segment")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return make_task_stores(tmp_path_factory.mktemp("tasks"))


def _batches(name, store, hyp, tmp_path, **kw):
    """One epoch's batches (copies: a batch lives until the next)."""
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, seed=3, shuffle=False, hyp=hyp, **kw)
    with create_loader(name, store, cfg, **({"cache_dir": str(tmp_path)} if name == "shm" else {})) as loader:
        return [copy(b) for b in loader]


# --- the declaration -------------------------------------------------------------------------------------

def test_each_renderer_declares_what_it_draws_and_nothing_else_refuses():
    assert CPU.augmentations == set(OPTIONAL) and CPU.object_masks
    assert renderer("shm") is CPU and renderer("device") is DEVICE and renderer("dali") is DALI
    assert "mixup" in DALI.augmentations and DALI.tasks == ("detect",)
    assert asked(AugmentHyp(bgr=0.2, mixup=0.0)) == ["bgr"]
    with pytest.raises(ValueError, match="no renderer declares loader 'nope'; declared: cpu, shm, device, dali"):
        renderer("nope")


def test_loaders_refuse_what_their_renderer_does_not_draw_by_name(segment):
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, device="cpu", task="detect")
    with pytest.raises(UnsupportedAugmentation, match=r"^the device loader does not render mixup=0.2, cutmix=0.5: set "
                                                      r"them to 0, or use the cpu or shm loader$"):
        create_loader("device", segment, replace(cfg, hyp=AugmentHyp(mixup=0.2, cutmix=0.5)))
    with pytest.raises(UnsupportedAugmentation, match=r"^the dali loader does not render bgr=0.1: set it to 0, or "
                                                      r"use the cpu, shm or device loader$"):
        create_loader("dali", segment, replace(cfg, hyp=AugmentHyp(bgr=0.1)))   # before DALI is asked for
    with pytest.raises(UnsupportedTask, match="the device loader makes a segment store's masks only with "
                                              "overlap_mask=True .* use the cpu or shm loader for"):
        create_loader("device", segment, LoaderConfig(imgsz=S, batch_size=4, device="cpu", overlap_mask=False))
    # evaluation batches draw nothing: nothing to refuse
    create_loader("device", segment, replace(cfg, augment=False, hyp=AugmentHyp(cutmix=0.5))).close()
    with pytest.raises(UnsupportedAugmentation, match="the device loader does not render copy_paste=0.1"):
        create_loader("device", segment, replace(cfg, hyp=AugmentHyp(copy_paste=0.1)))


# --- bgr ---------------------------------------------------------------------------------------------------

def test_bgr_is_the_last_draw_of_a_sample_and_none_when_off():
    hyp = AugmentHyp(mixup=0.5)
    off, on = batch_rng(1, 0, 0, 0), batch_rng(1, 0, 0, 0)
    plain = draw_sample(off, hyp, S, mosaic_on=True, mixup_on=True, candidates=8)
    swapped = draw_sample(on, replace(hyp, bgr=1.0), S, mosaic_on=True, mixup_on=True, candidates=8)
    assert not plain.bgr and swapped.bgr and replace(swapped, bgr=False) == plain   # the same draws before it
    off.random()                            # bgr on drew exactly one number more, after everything else
    assert off.random() == on.random()
    rng = batch_rng(2, 0, 0, 0)
    share = np.mean([draw_sample(rng, AugmentHyp(bgr=0.3), S, mosaic_on=False, mixup_on=False, candidates=1).bgr
                     for _ in range(4000)])
    assert abs(share - 0.3) < 0.03


@pytest.mark.parametrize("name", ["cpu", "shm", "device"])
def test_bgr_reverses_the_channels_and_nothing_else(segment, name, tmp_path):
    """With every other gain 0 the draws move nothing, so bgr=1 gives bgr=0's batches with the channels reversed,
    the same targets and masks; the masks stay on their paint."""
    rgb = _batches(name, segment, STILL, tmp_path, device="cpu")
    bgr = _batches(name, segment, replace(STILL, bgr=1.0), tmp_path, device="cpu")
    half = _batches(name, segment, replace(STILL, bgr=0.5), tmp_path, device="cpu")   # per sample, as drawn
    swapped = [not np.array_equal(x, y) for a, b in zip(rgb, half) for x, y in zip(a.images.numpy(), b.images.numpy())]
    assert 0 < sum(swapped) < len(swapped)
    for a, b in zip(rgb, bgr):
        assert np.array_equal(a.images.numpy()[:, ::-1], b.images.numpy())
        assert np.array_equal(a.targets.numpy(), b.targets.numpy()) and np.array_equal(a.masks.numpy(), b.masks.numpy())
    assert check_masks_on_paint(rgb, 4) > 0


# --- perspective -----------------------------------------------------------------------------------------

def test_perspective_is_ultralytics_T_S_R_P_C_with_flips_last():
    d = AffineDraw(0.3, 1.2, 0.1, -0.05, 70.0, 60.0, False, False, 4e-4, -7e-4)
    centre, size = (64.0, 48.0), 128
    c = np.array([[1, 0, -centre[0]], [0, 1, -centre[1]], [0, 0, 1.0]])
    p = np.array([[1, 0, 0], [0, 1, 0], [d.px, d.py, 1.0]])
    r = np.eye(3)
    r[:2] = cv2.getRotationMatrix2D((0, 0), np.degrees(d.angle), d.zoom)
    sh = np.array([[1, d.shear_x, 0], [d.shear_y, 1, 0], [0, 0, 1.0]])
    t = np.array([[1, 0, d.tx], [0, 1, d.ty], [0, 0, 1.0]])
    assert np.allclose(affine_matrix(d, centre, size, False), t @ sh @ r @ p @ c)
    flipped = affine_matrix(d._replace(flip_lr=True, flip_ud=True), centre, size, False)
    pts = np.array([[0.0, 0.0, 1.0], [100.0, 20.0, 1.0], [30.0, 90.0, 1.0]]).T
    a, b = t @ sh @ r @ p @ c @ pts, flipped @ pts
    assert np.allclose(b[:2] / b[2], size - a[:2] / a[2])


def test_perspective_is_drawn_last_in_the_affine_and_only_when_asked():
    off, on = batch_rng(5, 0, 0, 0), batch_rng(5, 0, 0, 0)
    plain, warped = draw_affine(off, AugmentHyp(), S), draw_affine(on, AugmentHyp(perspective=0.001), S)
    assert plain == warped._replace(px=0.0, py=0.0) and plain.px == plain.py == 0.0
    assert 0 < abs(warped.px) <= 0.001 and 0 < abs(warped.py) <= 0.001
    off.uniform(size=2)
    assert off.random() == on.random()
    assert not AugmentHyp(perspective=0.0005).axis_aligned
    with pytest.raises(ValueError, match=r"AugmentHyp.perspective=0.01 is out of range; valid: \[0.0, 0.001\]"):
        AugmentHyp(perspective=0.01)


@pytest.mark.parametrize("name", ["cpu", "shm", "device"])
def test_perspective_carries_masks_keypoints_and_corners_with_their_paint(stores, tmp_path, name):  # noqa: F811
    hyp = replace(HYP, perspective=0.001)   # at 128 px: up to a quarter of the scale, corner to corner
    assert check_masks_on_paint(batches(stores["segment"], name, tmp_path, hyp=hyp, mask_ratio=4), 4) > 20
    plain, flipped = check_keypoints_on_dots(batches(stores["pose"], name, tmp_path, hyp=hyp))
    assert plain > 5 and flipped > 5
    assert check_rboxes_on_paint(batches(stores["obb"], name, tmp_path, hyp=hyp)) > 20


# --- cutmix ------------------------------------------------------------------------------------------------

def test_cutmix_is_drawn_after_mixup_and_only_when_asked():
    hyp = AugmentHyp(mixup=0.5)
    off, on = batch_rng(7, 0, 0, 0), batch_rng(7, 0, 0, 0)
    plain = draw_sample(off, hyp, S, mosaic_on=True, mixup_on=True, candidates=8)
    cut = draw_sample(on, replace(hyp, cutmix=1.0), S, mosaic_on=True, mixup_on=True, candidates=8)
    assert plain.cut is None and cut.cut is not None and (plain.geometry, plain.mix) == (cut.geometry, cut.mix)
    assert len(cut.cut.rects) == 3 and all(0 <= a <= b <= S for x1, y1, x2, y2 in cut.cut.rects
                                           for a, b in ((x1, x2), (y1, y2)))
    assert cut.records(0, list(range(10, 18)))[-1 - len(cut.cut.geometry.partners or ()):][0] == 10 + cut.cut.other
    closed = draw_sample(batch_rng(7, 0, 0, 0), replace(hyp, cutmix=1.0), S, mosaic_on=False, mixup_on=False,
                         candidates=8)
    assert closed.cut is None and closed.mix is None


def _labels(boxes, cls=0):
    from fastfeed.augment import Labels

    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return Labels(b, np.full(len(b), cls, np.int64))


def test_cut_in_pastes_a_free_rectangle_and_the_objects_it_shows_clipped():
    from fastfeed.augment.cutmix import cut_in

    a, b = np.zeros((S, S, 3), np.uint8), np.full((S, S, 3), 200, np.uint8)
    first = _labels([[0, 0, 40, 40]])
    second = _labels([[50, 50, 90, 90], [100, 0, 110, 10]], cls=1)
    rects = ((10, 10, 60, 60), (60, 60, 128, 128), (0, 100, 20, 120))   # the first overlaps the first's box
    res, got = cut_in(a.copy(), first, b, second, rects, 0.0, AugmentHyp())   # free: the 2nd and 3rd; pick 0: 2nd
    assert (res[60:128, 60:128] == 200).all() and (res[:60] == 0).all() and (res[:, :60] == 0).all()
    assert got.classes.tolist() == [0, 1] and np.allclose(got.boxes[1], [60, 60, 90, 90])
    res, got = cut_in(a.copy(), first, b, second, rects, 0.9, AugmentHyp())   # the 3rd: it shows no object: skipped
    assert (res == 0).all() and len(got) == 1
    res, got = cut_in(a.copy(), _labels([[0, 0, 128, 128]]), b, second, rects, 0.0, AugmentHyp())   # none free
    assert (res == 0).all() and len(got) == 1


@pytest.mark.parametrize("name", ["cpu", "shm"])
def test_cutmix_carries_masks_keypoints_and_corners_with_their_paint(stores, tmp_path, name):  # noqa: F811
    hyp = replace(HYP, cutmix=1.0)
    assert check_masks_on_paint(batches(stores["segment"], name, tmp_path, hyp=hyp, mask_ratio=4), 4) > 20
    plain, flipped = check_keypoints_on_dots(batches(stores["pose"], name, tmp_path, hyp=hyp))
    assert plain > 5 and flipped > 5
    assert check_rboxes_on_paint(batches(stores["obb"], name, tmp_path, hyp=hyp)) > 20


def test_clip_corners_keeps_the_boxs_angle_and_only_the_part_inside():
    from fastfeed.augment.cutmix import clip_corners

    box = cv2.boxPoints(((50.0, 50.0), (40.0, 10.0), 30.0))   # a 40 x 10 box at 30 degrees, centred on 50, 50
    cut = clip_corners(box[None], (50.0, 0.0, 128.0, 128.0))[0]   # its right half kept
    (cx, cy), (w, h), angle = cv2.minAreaRect(cut)
    # visible: u >= v tan 30 along the box's axes, so u from -5 tan 30 to 20 and all of v
    assert min(w, h) == pytest.approx(10.0, abs=0.05) and max(w, h) == pytest.approx(20 + 5 * np.tan(np.radians(30)), abs=0.05)
    assert np.isclose((angle - 30.0) % 90.0, 0.0, atol=0.1) or np.isclose((angle - 30.0) % 90.0, 90.0, atol=0.1)
    assert (clip_corners(box[None], (100.0, 100.0, 128.0, 128.0)) == box[0]).all(-1).all()   # outside: a point


# --- copy_paste --------------------------------------------------------------------------------------------

def test_copy_paste_flip_draws_nothing_and_mixup_draws_before_the_mixup():
    hyp = AugmentHyp(mixup=1.0, cutmix=1.0)
    plain = draw_sample(batch_rng(9, 0, 0, 0), hyp, S, mosaic_on=True, mixup_on=True, candidates=8)
    flip = draw_sample(batch_rng(9, 0, 0, 0), replace(hyp, copy_paste=0.3), S, mosaic_on=True, mixup_on=True,
                       candidates=8)
    assert flip.paste is None and flip.geometry == replace(plain.geometry, paste_flip=True)
    # Ultralytics' mixup and cutmix second samples go through its pre_transform, copy-paste included
    assert flip.mix.geometry == replace(plain.mix.geometry, paste_flip=True) and flip.cut.geometry.paste_flip
    assert flip.hsv == plain.hsv and not plain.geometry.paste_flip
    mixed = draw_sample(batch_rng(9, 0, 0, 0), replace(hyp, copy_paste=1.0, copy_paste_mode="mixup"), S,
                        mosaic_on=True, mixup_on=True, candidates=8)
    assert mixed.paste.other is not None and mixed.geometry == plain.geometry
    assert not mixed.paste.geometry.paste_flip                  # its paste source: mosaic and affine alone
    seconds = [draw_sample(batch_rng(9, 0, 0, k), replace(hyp, copy_paste=0.5, copy_paste_mode="mixup"), S,
                           mosaic_on=True, mixup_on=True, candidates=8) for k in range(400)]
    nested = [q.mix.paste is not None for q in seconds] + [q.cut.paste is not None for q in seconds]
    assert abs(np.mean(nested) - 0.5) < 0.06                    # mixup's and cutmix's own copy-paste, as drawn
    with_both = next(q for q in seconds if q.mix.paste and q.cut.paste and q.paste)
    tiles = with_both.records(0, list(range(10, 18)))
    assert len(tiles) == 4 * 6 and tiles[4 * 3] == 10 + with_both.mix.paste.other   # own, paste, mix, its paste, cut, its
    assert mixed.records(0, list(range(10, 18)))[1 + 3] == 10 + mixed.paste.other   # after the own mosaic's tiles
    closed = draw_sample(batch_rng(9, 0, 0, 0), replace(hyp, copy_paste=0.3), S, mosaic_on=False, mixup_on=False,
                         candidates=8)
    assert closed.paste is None and not closed.geometry.paste_flip
    with pytest.raises(ValueError, match="AugmentHyp.copy_paste_mode='both': valid: 'flip', 'mixup'"):
        AugmentHyp(copy_paste_mode="both")


def test_pick_takes_the_least_covering_share_of_the_objects_that_cover_under_30_percent():
    from fastfeed.augment.copypaste import pick

    there = _labels([[0, 0, 10, 10]])
    candidates = _labels([[0, 0, 10, 10], [8, 8, 20, 20], [50, 50, 60, 60], [7, 0, 20, 10]])   # ioa 1, .04, 0, .3
    assert pick(there, candidates, 1.0).tolist() == [2, 1]
    assert pick(there, candidates, 0.5).tolist() == [2]
    assert pick(_labels([]), candidates, 0.5).tolist() == [0, 1]


def test_flip_pastes_the_mirrored_frame_as_ultralytics_canvas_before_the_affine():
    """Mode "flip" chooses among the objects of the whole mid frame and mirrors the frame about its centre, then
    the affine: here a shift of +60 px shows A (x 20-40 of the frame) and not B (x 100-120); B mirrored (x 8-28)
    lands in view and is pasted with B's pixels, A mirrored (x 88-108) lands outside and is dropped."""
    from fastfeed.augment import Geometry, Labels, render_labels

    img = np.full((S, S, 3), 100, np.uint8)
    img[20:40, 20:40], img[60:80, 100:120] = 250, 200

    def square(x, y):
        return np.array([[x, y], [x + 20, y], [x + 20, y + 20], [x, y + 20]], np.float32)

    labels = Labels(np.array([[20, 20, 40, 40], [100, 60, 120, 80]], np.float32), np.array([1, 2]),
                    [square(20, 20), square(100, 60)])
    shift = AffineDraw(0.0, 1.0, 0.0, 0.0, 64.0 + 60.0, 64.0, False, False)
    hyp = AugmentHyp(copy_paste=1.0)
    out, got = render_labels([(img, labels)], Geometry(None, None, shift, True), S, hyp, np.empty_like(img))
    assert got.classes.tolist() == [1, 2]
    assert np.allclose(got.boxes, [[80, 20, 100, 40], [68, 60, 88, 80]])
    assert (out[60:80, 68:88] == 200).all() and (out[20:40, 80:100] == 250).all()
    plain_out, plain = render_labels([(img, labels)], Geometry(None, None, shift), S, hyp, np.empty_like(img))
    assert plain.classes.tolist() == [1] and (plain_out[60:80, 68:88] == 100).all()
    detect = Labels(labels.boxes, labels.classes)    # no polygon: nothing pasted
    assert len(render_labels([(img, detect)], Geometry(None, None, shift, True), S, hyp, np.empty_like(img))[1]) == 1


@pytest.mark.parametrize("mode", ["flip", "mixup"])
def test_copy_paste_masks_lie_on_their_paint_and_add_objects(stores, tmp_path, mode):  # noqa: F811
    hyp = replace(HYP, mosaic=0.0, copy_paste=1.0, copy_paste_mode=mode)
    got = batches(stores["segment"], "cpu", tmp_path, hyp=hyp, mask_ratio=4)
    plain = batches(stores["segment"], "cpu", tmp_path, hyp=replace(hyp, copy_paste=0.0), mask_ratio=4)
    assert check_masks_on_paint(got, 4, on_paint=0.6) > 20   # a pasted object may hide 30% of one's box
    assert sum(len(b.targets) for b in got) > 1.2 * sum(len(b.targets) for b in plain)


# --- Albumentations ---------------------------------------------------------------------------------------------

A = pytest.importorskip("albumentations")
from fastfeed.augment.albu import Albu, apply, encode  # noqa: E402

DEFAULTS = (A.Blur(p=0.01), A.MedianBlur(p=0.01), A.ToGray(p=0.01), A.CLAHE(p=0.01), A.RandomGamma(p=0.0))


def test_albumentations_are_drawn_before_hsv_at_their_rate_and_only_when_asked():
    hyp = AugmentHyp(mixup=0.5)
    off, on = batch_rng(1, 0, 0, 0), batch_rng(1, 0, 0, 0)
    plain = draw_sample(off, hyp, S, mosaic_on=True, mixup_on=True, candidates=8)
    albu = draw_sample(on, replace(hyp, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, albumentations=(A.Blur(p=1.0),)), S,
                       mosaic_on=True, mixup_on=True, candidates=8)
    assert plain.albu is None and albu.albu.which == (0,)
    assert albu.geometry == plain.geometry and albu.mix == plain.mix   # off: nothing drawn, old seeds unchanged
    rng = batch_rng(2, 0, 0, 0)
    defaults = AugmentHyp(albumentations=DEFAULTS)
    assert len(defaults.albumentations) == 4                           # p=0 transforms never fire: not held
    plans = [draw_sample(rng, defaults, S, mosaic_on=False, mixup_on=False, candidates=1).albu for _ in range(20000)]
    fired = np.array([[p is not None and i in p.which for i in range(4)] for p in plans])
    assert np.allclose(fired.mean(0), 0.01, atol=0.003)                # each at its own p, independently
    assert abs(np.mean([p is not None for p in plans]) - (1 - 0.99 ** 4)) < 0.006


def test_albumentations_take_pixel_transforms_only_and_compare_by_value():
    with pytest.raises(ValueError, match="HorizontalFlip moves the image's geometry; fastfeed applies pixel-level"):
        AugmentHyp(albumentations=(A.Blur(p=0.1), A.HorizontalFlip(p=0.5)))
    with pytest.raises(ValueError, match="OneOf moves"):   # a composition holding one
        AugmentHyp(albumentations=(A.OneOf([A.Blur(), A.Affine()], p=0.1),))
    with pytest.raises(ValueError, match="albumentations: 'blur' is not an Albumentations transform"):
        AugmentHyp(albumentations=("blur",))
    hyp = AugmentHyp(albumentations=DEFAULTS)
    assert hyp == AugmentHyp(albumentations=DEFAULTS) == AugmentHyp(albumentations=hyp.albumentations)


def test_apply_runs_exactly_the_drawn_transforms_seeded_on_bgr_pixels():
    img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    img[:, :, 0] = 200                                                  # red plane flat: ToGray weighs BGR as RGB
    encoded = encode(DEFAULTS)
    gray = img.copy()
    apply(gray, Albu((2,), 7), encoded)
    assert (gray == gray[..., :1]).all()
    expect = A.ToGray(p=1.0)(image=np.ascontiguousarray(img[..., ::-1]))["image"][..., ::-1]
    assert np.array_equal(gray, expect)
    twice = [img.copy(), img.copy()]
    for out in twice:
        apply(out, Albu((0, 3), 11), encoded)
    assert np.array_equal(*twice) and not np.array_equal(twice[0], img)   # the seed fixes the parameters


@pytest.mark.parametrize("name", ["cpu", "shm"])
def test_albumentations_change_pixels_of_the_samples_drawn_and_no_label(segment, name, tmp_path):
    plain = _batches(name, segment, STILL, tmp_path)
    hyp = replace(STILL, albumentations=(A.ToGray(p=0.5),))
    got = _batches(name, segment, hyp, tmp_path)
    kinds = []
    for a, b in zip(plain, got):
        assert np.array_equal(a.targets.numpy(), b.targets.numpy()) and np.array_equal(a.masks.numpy(), b.masks.numpy())
        for x, y in zip(a.images.numpy(), b.images.numpy()):
            same, gray = np.array_equal(x, y), bool((y == y[:1]).all()) and not (x == x[:1]).all()
            assert same != gray                                        # as drawn: untouched, or the transform's
            kinds.append(gray)
    assert 0 < sum(kinds) < len(kinds)
    with pytest.raises(UnsupportedAugmentation, match=r"the device loader does not render albumentations=\[ToGray"):
        create_loader("device", segment, LoaderConfig(imgsz=S, batch_size=4, device="cpu", hyp=hyp))


def test_a_mixups_second_sample_gets_its_own_copy_paste_before_the_blend():
    """Ultralytics makes mixup's second sample with its pre_transform, copy-paste (mode "mixup") included: here
    the second sample (B) gets C's object before it is blended in. `second` renders into one shared scratch, as
    the loaders' does: B must survive C's rendering."""
    from fastfeed.augment import Geometry, Labels, mix_in
    from fastfeed.augment.plan import Mix, Paste, SamplePlan

    def sample(x, value):
        img = np.full((S, S, 3), 0, np.uint8)
        img[20:40, x:x + 20] = value
        poly = np.array([[x, 20], [x + 20, 20], [x + 20, 40], [x, 40]], np.float32)
        return img, Labels(np.array([[x, 20, x + 20, 40]], np.float32), np.array([x]), [poly])

    scratch = np.empty((S, S, 3), np.uint8)

    def second(other, geometry):
        img, labels = sample(*{1: (60, 200), 2: (100, 100)}[other])
        scratch[:] = img
        return scratch, labels

    g = Geometry(None, None, AffineDraw(0.0, 1.0, 0.0, 0.0, 64.0, 64.0, False, False))
    res, labels = sample(10, 50)
    plan = SamplePlan(g, Mix(1, g, 0.5, Paste(2, g)), None)
    out, got = mix_in(res, labels, plan, second, AugmentHyp(copy_paste=1.0, copy_paste_mode="mixup"))
    assert got.classes.tolist() == [10, 60, 100]
    assert (out[30, 15] == 25).all() and (out[30, 65] == 100).all() and (out[30, 105] == 50).all()
