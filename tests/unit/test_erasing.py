"""RandomErasing as `fastdata run` lowers it (`fastdata.run._erasing`), without torchvision: the
reasons it is refused, the rectangles' draws, and the rectangles written over a laid-out batch
with torchvision's arithmetic written out (`img[..., i:i+h, j:j+w] = v`, then the steps after it).
Against torchvision itself: tests/contract/test_torchvision_faithful.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.run import _layout as rt
from fastdata.run._erasing import Erase, draw, lowered, params

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
STEPS = (("to", None, "div"), ("normalize", MEAN, STD))


class RandomErasing:  # the attributes torchvision's v1 op keeps (v2's: its value as floats, and _log_ratio)
    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, v2=False):
        self.p, self.scale, self.ratio, self.value = p, scale, ratio, value
        if v2:
            self.value = None if value == "random" else [float(x) for x in np.atleast_1d(value)]
            self._log_ratio = torch.log(torch.tensor(ratio))


@pytest.mark.parametrize("op,v2,domain,words", [
    (RandomErasing(), False, "pil", "of a PIL image: torchvision raises"),
    (RandomErasing(v2=True), True, "pil", "v2 erases it before the conversion"),
    (RandomErasing(value=(1, 2)), False, "float", "for 3 channels: torchvision raises"),
    (RandomErasing(value="random", v2=True), True, "uint8", "(value='random') on a uint8 image"),
    (RandomErasing(value=-1), False, "uint8", "past uint8's range"),
    (RandomErasing(value=np.int64(3)), False, "float", "torchvision raises"),  # v1's forward takes len() of it
    (RandomErasing(scale=(0.4, 0.2)), False, "float", "scale (0.4, 0.2)"),
    (RandomErasing(ratio=(0.0, 1.0)), False, "float", "ratio (0.0, 1.0)"),  # log(0): uniform_ raises
])
def test_refused_with_a_reason(op, v2, domain, words):
    with pytest.raises(ValueError) as e:
        lowered(op, v2, domain, 0)
    assert words in str(e.value) and str(e.value).startswith("RandomErasing"), str(e.value)


def test_lowered_values():
    assert lowered(RandomErasing(value=True), False, "float", 1).value == (1.0,)
    assert lowered(RandomErasing(value="random"), False, "float", 1).value is None
    assert lowered(RandomErasing(value=[3, 4, 5]), False, "uint8", 0).value == (3.0, 4.0, 5.0)
    v1, v2 = lowered(RandomErasing(p=0.3), False, "float", 2), lowered(RandomErasing(p=0.3, v2=True), True, "float", 2)
    assert v1 == v2 == Erase(0.3, (0.02, 0.33), v1.log_ratio, (0.0,), 2)
    assert v1.log_ratio == tuple(torch.log(torch.tensor([0.3, 3.3])).tolist())


@pytest.mark.parametrize("img_h,img_w", [(96, 128), (8, 8)])
def test_params(img_h, img_w):
    op = Erase(0.5, (0.5, 0.9) if img_h == 8 else (0.02, 0.33), (-1.2, 1.2), (0.0,), 0)
    u = np.random.default_rng(0).random((4000, 23))
    hit, rects = params(op, u, img_h, img_w)
    assert np.array_equal(hit, u[:, 0] < 0.5)
    whole = (rects == [0, 0, img_h, img_w]).all(1)
    i, j, h, w = rects[~whole].T
    assert (h < img_h).all() and (w < img_w).all() and (i >= 0).all() and (j >= 0).all()
    assert (i + h <= img_h).all() and (j + w <= img_w).all()
    assert set(i[h == img_h - 1]) == {0, 1} if img_h == 8 else len(set(i)) > 50  # randint(0, img_h - h + 1)
    share = h * w / (img_h * img_w)
    assert share.min() > 0.3 * op.scale[0] and share.max() < 1.5 * op.scale[1]
    assert 0.05 < whole.mean() < 0.6 if img_h == 8 else whole.mean() < 0.01  # no attempt fits: the image as it is
    (got, rows), = draw((op,), 7, np.arange(50), img_h, img_w)
    assert got == op and len(rows) % 40 == 0 and 0 < len(rows) // 40 < 50


@pytest.mark.parametrize("native", [True, False], ids=["lookup", "no extension"])
def test_erased_over_the_layout(native, monkeypatch):
    """Two ops, before and after Normalize, overlapping: each rectangle holds its value cast and
    normalized where Normalize follows it, the last one written on top; noise from the seed."""
    if not native:
        monkeypatch.setattr(rt, "_ext", None)
    before, after = Erase(1.0, (0.1, 0.2), (0.0, 0.0), (0.9, 0.1, 0.55), 1), Erase(1.0, (0.1, 0.2), (0.0, 0.0), None, 2)
    rects = ([(0, 1, 2, 5, 6), (2, 0, 0, 3, 3)], [(0, 3, 4, 4, 4)])
    erased = tuple((op, np.array(r, np.int64).tobytes()) for op, r in zip((before, after), rects))
    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, 10, 12, 3), dtype=np.uint8))
    lowering = rt.Lowering((), (), "bilinear", STEPS, "ToTensor, RandomErasing, Normalize, RandomErasing",
                           (before, after))
    got = rt.Finish(lowering, slots=2, pin=False, forks=False)([images, torch.arange(3),
                                                                 rt.Layout(STEPS, erased, 5)])[0]
    noise = torch.Generator().manual_seed(5)
    for k in range(3):
        x = images[k].permute(2, 0, 1).float().div(255)
        for _, i, j, h, w in (r for r in rects[0] if r[0] == k):
            x[..., i:i + h, j:j + w] = torch.tensor(before.value)[:, None, None]
        x = x.sub(torch.tensor(MEAN).view(3, 1, 1)).div(torch.tensor(STD).view(3, 1, 1))
        for _, i, j, h, w in (r for r in rects[1] if r[0] == k):
            x[..., i:i + h, j:j + w] = torch.empty((3, h, w)).normal_(generator=noise)
        assert torch.equal(got[k], x), k
