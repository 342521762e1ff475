"""fastdata's twins of torchvision's uint8 tensor kernels (`fastdata.run._kernels`, the
extension's `tensor_enhance`), which AugMix's chains run: the extension against a NumPy
statement of torchvision's float32 steps (here and under the sanitizers, scripts/sanitize.sh);
each twin against torchvision's own kernel, value for value, over the values, ranges and factors
they meet; the ops and cases left to torchvision's call; a twin that disagrees with the
installed torchvision is not used. The torchvision tests run in CI's torchvision environment
(.ci/run) and skip without it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fastdata._ext import native  # noqa: E402
from fastdata.run import _kernels as K  # noqa: E402

needs_native = pytest.mark.skipif(native is None or not hasattr(native, "tensor_enhance"),
                                  reason="fastdata's native extension is not built")


@pytest.fixture
def tv():
    """torchvision's transforms, functional tensor kernels (v1's, v2's) and InterpolationMode."""
    pytest.importorskip("torchvision")
    import torchvision.transforms as T
    from torchvision.transforms import _functional_tensor as F1
    from torchvision.transforms.v2 import functional as F2

    return T, F1, F2, T.InterpolationMode
NAMES = ["Brightness", "Contrast", "Color", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize",
         "TranslateX", "TranslateY"]
# AugMix's enhance factors (1 + its signed magnitudes, severity up to 10), and others
FACTORS = sorted({round(1 + s * k * 0.09, 2) for k in range(11) for s in (1, -1)} | {0.0, 2.5, 3.7, 1 + 2 ** -19})


def _images(seed: int = 0) -> list[np.ndarray]:
    """uint8 images [C, H, W]: noise, a few levels, a photograph's gradients, near-white, a flat
    one, one channel; sizes from 3 x 3 up, odd and even."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:37, 0:53]
    photo = np.clip(np.stack([x * 4, y * 6, x + y * 2]) + rng.normal(0, 9, (3, 37, 53)), 0, 255)
    return [rng.integers(0, 256, (3, 29, 31), dtype=np.uint8),
            (rng.integers(0, 4, (3, 16, 24)) * 80 + 5).astype(np.uint8),
            photo.astype(np.uint8), rng.integers(248, 256, (3, 7, 5), dtype=np.uint8),
            np.full((3, 3, 3), 77, dtype=np.uint8), rng.integers(0, 256, (1, 11, 13), dtype=np.uint8),
            rng.integers(0, 256, (3, 3, 4), dtype=np.uint8), rng.integers(0, 256, (3, 224, 224), dtype=np.uint8)]


def _steps(img: np.ndarray, kind: int, factor: float) -> np.ndarray:
    """torchvision's v1 steps in NumPy's float32 (each operation rounded, as torch's): _blend's
    ratio * image + (1 - ratio) * degenerate, clamped, truncated."""
    f, r, q = img.astype(np.float32), np.float32(factor), np.float32(1.0 - factor)
    w = np.float32(0.2989), np.float32(0.587), np.float32(0.114)
    gray = (w[0] * f[0] + w[1] * f[1] + w[2] * f[2]).astype(np.uint8) if len(img) == 3 else img[0]
    if kind == 0:
        degenerate = np.zeros_like(f)
    elif kind == 1:
        degenerate = np.float32(gray.sum(dtype=np.int64)) / np.float32(gray.size)
    elif kind == 2:
        degenerate = gray.astype(np.float32)[None]
    else:  # the 3 x 3 smoothing (1 1 1 / 1 5 1 / 1 1 1 over 13) rounded inside the border
        p = img.astype(np.int64)
        s = sum(p[:, 1 + dy:p.shape[1] - 1 + dy, 1 + dx:p.shape[2] - 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1))
        degenerate = f.copy()
        degenerate[:, 1:-1, 1:-1] = (s + 4 * p[:, 1:-1, 1:-1] + 6) // 13
    return np.clip(r * f + q * degenerate, 0, 255).astype(np.uint8)


@needs_native
@pytest.mark.parametrize("kind", [0, 1, 2, 3], ids=["Brightness", "Contrast", "Color", "Sharpness"])
def test_the_extensions_enhance_takes_torchvisions_steps(kind):
    """The extension's Brightness, Contrast, Color and Sharpness give the values of torchvision's
    float32 steps (stated in NumPy), at every size from 3 x 3 up and every factor."""
    for img in _images(9):
        if kind == 2 and len(img) != 3:
            continue
        for factor in FACTORS:
            out = np.empty_like(img)
            native.tensor_enhance(img, out, kind, factor)
            want = _steps(img, kind, factor)
            assert np.array_equal(out, want), f"{img.shape}, factor {factor}: {int((out != want).sum())} values differ"


@needs_native
@pytest.mark.parametrize("kind", [0, 1, 2, 3], ids=["Brightness", "Contrast", "Color", "Sharpness"])
def test_the_enhance_twins_are_torchvisions_kernels(kind, tv):
    """Brightness, Contrast, Color and Sharpness by the extension give torchvision's v1 tensor
    kernels' values (Brightness v2's too) for every image and factor; Contrast up to the largest
    image whose grayscale sums exactly (256 x 256)."""
    _, F1, F2, _ = tv
    v1 = (F1.adjust_brightness, F1.adjust_contrast, F1.adjust_saturation, F1.adjust_sharpness)[kind]
    images = _images() + ([np.random.default_rng(3).integers(0, 256, (3, 256, 256), dtype=np.uint8),
                           np.full((3, 256, 256), 255, dtype=np.uint8)] if kind == 1 else [])
    checked = 0
    for img in images:
        if kind == 2 and img.shape[0] != 3:
            continue
        for factor in FACTORS:
            out = np.empty_like(img)
            native.tensor_enhance(img, out, kind, factor)
            want = v1(torch.from_numpy(img), factor).numpy()
            assert np.array_equal(out, want), f"{img.shape}, factor {factor}: {int((out != want).sum())} values differ"
            if kind == 0:
                assert np.array_equal(out, F2.adjust_brightness_image(torch.from_numpy(img), factor).numpy())
            checked += 1
    assert checked >= 7 * len(FACTORS)


@needs_native
def test_the_extensions_mixing_takes_torchs_steps():
    """`mix_add` gives the values of torch's `w * image` and `mix.add_(...)` (stated in NumPy's
    float32: each product and sum rounded), over every byte value, with Dirichlet weights as
    AugMix draws them; it refuses arrays of two sizes."""
    rng = np.random.default_rng(10)
    images = [np.arange(256, dtype=np.uint8)] + [rng.integers(0, 256, 1001, dtype=np.uint8) for _ in range(4)]
    weights = [np.float32(w) for w in rng.dirichlet([1.0] * 5)]
    acc, want = np.empty(256, np.float32), np.float32(weights[0]) * images[0].astype(np.float32)
    native.mix_add(acc, images[0], float(weights[0]), True)
    assert np.array_equal(acc, want)
    acc, want = np.resize(acc, 1001), weights[0] * images[1].astype(np.float32)
    native.mix_add(acc, images[1], float(weights[0]), True)
    for w, img in zip(weights[1:], images[2:]):
        native.mix_add(acc, img, float(w), False)
        want = want + w * img.astype(np.float32)
    assert np.array_equal(acc, want)
    with pytest.raises(ValueError, match="of one size"):
        native.mix_add(acc, images[0], 0.5, False)


@needs_native
def test_the_extensions_reversed_blend_takes_torchs_steps():
    """`mix_reversed` (timm's FastCollateMixup blend) gives torch's `(x.float() * a + y.float() * b)`,
    `torch.round` and `.byte()` of each sample and the one at the batch's other end, as they
    were: over every byte value, ties to even (a weight of one half), both samples of a pair or
    one, weights 0 and 1; a sample not blended is left; it refuses a weight out of [0, 1]."""
    rng = np.random.default_rng(11)
    n = 8
    x = rng.integers(0, 256, (n, 3, 17, 23), dtype=np.uint8)
    x[0, 0, 0, :] = x[n - 1, 0, 0, :] = 1
    x[0, 0, 0, 0] = 2  # (2 * 0.5 + 1 * 0.5 = 1.5: ties to even, 2)
    x[1].flat[:256] = np.arange(256)
    a = np.array([0.5, 0.3, 1.0, 0.0, 0.7, 0.25, 0.9, 0.5], np.float32)
    b = (1 - a).astype(np.float32)
    blend = np.array([1, 1, 1, 1, 0, 1, 0, 1], np.uint8)
    got = x.copy()
    native.mix_reversed(got, a, b, blend)
    t = torch.from_numpy(x)
    for i in range(n):
        if not blend[i]:
            assert np.array_equal(got[i], x[i])
            continue
        mixed = t[i].float() * float(a[i]) + t[n - 1 - i].float() * float(b[i])
        assert np.array_equal(got[i], torch.round(mixed).byte().numpy()), i
    assert got[0, 0, 0, 0] == 2
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        native.mix_reversed(x.copy(), a + 0.6, b, blend)


@needs_native
def test_the_enhance_twin_refuses_what_it_cannot_give():
    """The extension refuses, saying why, a Contrast whose sum would not be exact, a Color of one
    channel, a Sharpness under 3 pixels a side, a negative factor and an out that is the src."""
    big, one = np.zeros((3, 257, 257), np.uint8), np.zeros((1, 8, 8), np.uint8)
    for img, kind, factor, why in [(big, 1, 1.5, r"under 2\^24"), (one, 2, 1.5, "Color: 3"),
                                   (np.zeros((3, 2, 9), np.uint8), 3, 1.5, "at least 3"),
                                   (one, 0, -0.5, "factor >= 0")]:
        with pytest.raises(ValueError, match=why):
            native.tensor_enhance(img, np.empty_like(img), kind, factor)
    with pytest.raises(ValueError, match="apart from src"):
        native.tensor_enhance(one, one, 0, 1.5)


@needs_native
@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_the_table_twins_are_torchvisions_kernels(v2, tv):
    """Posterize (1 to 8 bits), Solarize (each threshold of AugMix's tables at 31 bins), AutoContrast
    (each range a channel can span, one channel and three) and Equalize (noise, levels, one level,
    a skewed histogram) give torchvision's kernels' values, v1's and v2's as each AugMix calls them."""
    rng = np.random.default_rng(1)
    ramps = np.minimum(np.arange(256)[None, :], np.arange(1, 256)[:, None])
    spans = [(ramps[k:k + 3] + np.array([[0], [255 - k - 3], [k // 2]]))[:, None].clip(0, 255).astype(np.uint8)
             for k in range(0, 252, 3)]
    skewed = np.where(rng.random((3, 40, 40)) < 0.97, 200, rng.integers(0, 256, (3, 40, 40))).astype(np.uint8)
    images = _images(1) + spans + [skewed, np.full((3, 9, 9), 3, np.uint8), spans[5][1:2]]
    thresholds = np.linspace(1.0, 0.0, 31, dtype=np.float32) if v2 else np.linspace(255.0, 0.0, 31, dtype=np.float32)
    cases = [("Posterize", float(b)) for b in range(1, 9)] + [("Solarize", float(t)) for t in thresholds]
    cases += [("AutoContrast", 0.0), ("Equalize", 0.0)]
    for img in images:
        t = torch.from_numpy(img)
        for name, m in cases:
            if name in ("Posterize", "Solarize") and img.shape[1] == 1:
                continue  # (the spans are for AutoContrast)
            ours = K._compute(v2, name, m, t, None, None)
            want = K._torchvisions(v2, name, m, t, None)
            assert ours is not None and torch.equal(ours, want), f"{name} {m} on {img.shape}"


@needs_native
@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_translations_are_torchvisions_kernels(v2, tv):
    """TranslateX and TranslateY, nearest and bilinear, with no fill: a whole-pixel shift with
    zeros, torchvision's grid's image, for shifts both ways, past the image and on large images."""
    InterpolationMode = tv[3]
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, s, dtype=np.uint8) for s in ((3, 29, 31), (1, 8, 5), (3, 224, 224), (3, 375, 500))]
    for img in images:
        t = torch.from_numpy(img)
        for name in ("TranslateX", "TranslateY"):
            for m in (0.0, 1.0, -1.0, 6.7, -13.2, 74.6, -166.0, 600.0):
                for mode in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
                    ours = K._compute(v2, name, m, t, mode, None)
                    assert torch.equal(ours, K._torchvisions(v2, name, m, t, mode)), f"{name} {m} {mode} {img.shape}"


@needs_native
def test_twins_are_left_out_where_torchvisions_call_must_run(tv):
    """No twin for v2's Contrast, Color and Sharpness (their fused sums depend on where a value
    lies), the geometry that interpolates (Rotate, ShearX, ShearY), a translation with a fill or
    another interpolation, a Posterize outside 1 to 8 bits, a Solarize over 255, a Color of one
    channel, a Contrast whose sum would not be exact, or an image other than uint8 [C, H, W] or
    empty; the others have one."""
    InterpolationMode = tv[3]
    img = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (3, 12, 14), dtype=np.uint8))
    bilinear = InterpolationMode.BILINEAR
    for v2, name, m, image, mode, fill in [
            (True, "Contrast", 0.3, img, bilinear, None), (True, "Color", 0.3, img, bilinear, None),
            (True, "Sharpness", 0.3, img, bilinear, None), (False, "Rotate", 3.0, img, bilinear, None),
            (False, "ShearX", 0.1, img, bilinear, None), (True, "ShearY", 0.1, img, bilinear, None),
            (False, "TranslateX", 2.0, img, bilinear, [1, 2, 3]), (True, "TranslateY", 2.0, img, bilinear, 7),
            (False, "TranslateX", 2.0, img, InterpolationMode.BICUBIC, None),
            (False, "Posterize", 0.0, img, None, None),
            (False, "Solarize", 256.0, img, None, None), (True, "Solarize", 1.5, img, None, None),
            (False, "Color", 0.3, img[:1], None, None), (False, "Brightness", 0.3, img[None], None, None),
            (False, "Contrast", 0.3, torch.zeros((3, 257, 257), dtype=torch.uint8), None, None),
            (False, "Brightness", 0.3, img.float(), None, None),
            (True, "Equalize", 0.0, img[:, :0], None, None)]:
        assert K.twin(v2, name, m, image, mode, fill) is None, (v2, name, m)
    for v2 in (False, True):
        for name in NAMES:
            if not (v2 and name in ("Contrast", "Color", "Sharpness")):
                m = {"Posterize": 3.0, "Solarize": 0.5 if v2 else 200.0}.get(name, 0.27)
                assert K.twin(v2, name, m, img, bilinear, None) is not None, (v2, name)


@needs_native
def test_a_twin_that_disagrees_with_torchvision_is_not_used(monkeypatch, tv):
    """A twin whose values differ from the installed torchvision's (here: the extension's
    Brightness off by one level) fails the probe, and torchvision's call runs instead."""
    class Off:
        def __getattr__(self, name):
            return getattr(native, name)

        @staticmethod
        def tensor_enhance(src, out, kind, factor):
            native.tensor_enhance(src, out, kind, factor)
            np.minimum(out, 254, out=out)

    img = torch.from_numpy(np.random.default_rng(5).integers(0, 256, (3, 10, 10), dtype=np.uint8))
    K._agrees.cache_clear()
    monkeypatch.setattr(K, "native", Off())
    try:
        assert K.twin(False, "Brightness", 0.5, img, None, None) is None
        assert K.twin(False, "Equalize", 0.0, img, None, None) is not None  # (the others still run)
    finally:
        monkeypatch.undo()
        K._agrees.cache_clear()
    assert K.twin(False, "Brightness", 0.5, img, None, None) is not None


@needs_native
@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_augmix_chains_run_the_twins(v2, monkeypatch, tv):
    """AugMix as fastdata lowers it calls torchvision only for the ops without a twin (v1: Rotate,
    ShearX, ShearY; v2: those and Contrast, Color, Sharpness), and its image is torchvision's
    own AugMix's for the same seed, laid out as it, on an image laid out as a PIL image's tensor is
    (its chains mixed natively: `mix_add`)."""
    T = tv[0]
    import torchvision.transforms.autoaugment as A
    import torchvision.transforms.v2 as V

    from fastdata.run._augmix import _torchvisions, augmix

    op = V.AugMix() if v2 else T.AugMix()
    ours = augmix(op, "uint8")
    tv = _torchvisions(v2, op.severity, op.mixture_width, op.chain_depth, op.alpha, op.all_ops, op.interpolation,
                       op.fill)
    # (laid out as pil_to_tensor gives it, channels last, of a size whose values do not fill whole vector lanes)
    img = torch.from_numpy(np.random.default_rng(6).integers(0, 256, (37, 53, 3), dtype=np.uint8)).permute(2, 0, 1)
    assert all(K._agrees(v2, name) for name in NAMES if K._supported(v2, name))  # (its probes call torchvision)
    called = []
    for seed in range(40):
        torch.manual_seed(seed)
        want = op(img)
        with monkeypatch.context() as mp:
            if v2:
                theirs = V.AugMix._apply_image_or_video_transform
                mp.setattr(V.AugMix, "_apply_image_or_video_transform",
                           lambda self, image, name, *a, **k: called.append(name) or theirs(self, image, name, *a, **k))
            else:
                theirs = A._apply_op
                mp.setattr(A, "_apply_op",
                           lambda image, name, *a, **k: called.append(name) or theirs(image, name, *a, **k))
            got = ours.mix(tv, img, torch.Generator().manual_seed(seed))
        assert torch.equal(got, want) and got.stride() == want.stride(), f"seed {seed}"
    left = {"Rotate", "ShearX", "ShearY"} | ({"Contrast", "Color", "Sharpness"} if v2 else set())
    others = sorted({name for name in called if name not in left})
    assert not others and left & set(called), f"torchvision's call ran for {others}"
