"""`fastdata run`'s RandomErasing (torchvision's v1 and v2 classes, and timm's) on a natively
served batch: read from the script's op (`lowered`, `lowered_timm`), its rectangles drawn per
sample in the process that decodes as the op draws them (`params`: torchvision's `get_params`;
`timm_rows`: timm's `_erase`; `draw`: numbers only, carried with the batch), and written over the
laid-out batch (`erase`): in the main process, or where the batch is fetched when a collate_fn of
the script's gets the samples.

torchvision erases a CHW tensor: `img[..., i:i+h, j:j+w] = v`, v being `torch.tensor(value)` (a
float32 [C, 1, 1], or float32 standard normal noise [C, h, w] for 'random') cast to the image's
dtype, which the ops after it (ToDtype, Normalize) then take as any pixel. `erase` makes the same
value with the same torch operations: the cast, then the steps after the op through the
function that lays the batch out, so a rectangle holds torchvision's values bit for bit. timm's
erases a normalized float image with zeros ('const'), a standard normal value per channel
('rand') or per pixel ('pixel'), in up to `max_count` rectangles, each of 1/count of the area.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..transforms._random import uniforms

_STREAM = 1 << 21  # the erasing ops' uniforms: apart from the geometry's (0, 1, ...) and the pixel ops' (1 << 20 on)
_ATTEMPTS = 10  # torchvision's
_DRAWS = 1 + 2 * _ATTEMPTS + 2  # the p test, (area, log-aspect) per attempt, then top and left
_MAX_COUNT = 16  # timm's rectangles per image fastdata draws at most (each takes _DRAWS - 1 uniforms)


@dataclass(frozen=True)
class Erase:
    """A RandomErasing as fastdata runs it."""

    p: float
    scale: tuple[float, float]
    log_ratio: tuple[float, float]  # torch.log of the ratio, as torchvision computes it (float32)
    value: tuple | None  # torchvision's v is torch.tensor(value)[:, None, None]; None: standard normal noise
    at: int  # how many of the lowering's tensor steps come before it (those after it take its value too)
    # timm's: its rectangles per image, drawn in [min, max] (torchvision's op: none), and whose noise
    # is one value per channel ('rand') rather than per pixel
    count: tuple[int, int] | None = None
    per_channel: bool = False

    @property
    def draws(self) -> int:
        """The uniforms it takes per sample."""
        return _DRAWS if self.count is None else 2 + self.count[1] * (_DRAWS - 1)


def lowered(op: Any, v2: bool, domain: str, at: int) -> Erase:
    """The Erase of torchvision's RandomErasing `op` (v2's with `v2`) on what the ops before it
    give (`domain`: "pil", "uint8" or "float"), after `at` tensor steps; raises ValueError with
    the reason where fastdata has no faithful lowering of it."""
    kind = type(op).__name__
    if domain == "pil":
        raise ValueError(f"{kind} of a PIL image: " + ("torchvision's v2 erases it before the conversion; not lowered"
                                                      if v2 else "torchvision raises"))
    value = op.value  # as the op's forward reads it: v2 holds a list of floats (None for 'random')
    if not v2:
        if isinstance(value, (int, float)):
            value = [float(value)]
        elif isinstance(value, str):
            value = None
    if value is not None:
        try:
            value = tuple(float(x) for x in value) if not v2 else tuple(value)
            v = torch.tensor(list(value))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{kind} with value {op.value!r}: torchvision raises; not lowered") from None
        if v.dim() != 1 or len(v) not in (1, 3):
            raise ValueError(f"{kind} with value {op.value!r} for 3 channels: torchvision raises; not lowered")
        if v.is_complex():
            raise ValueError(f"{kind} with the complex value {op.value!r}: not lowered")
        if domain == "uint8" and not bool(((v > -1) & (v < 256)).all()):
            raise ValueError(f"{kind} with value {op.value!r} on a uint8 image: the cast of a value past uint8's "
                             "range is undefined; not lowered")
    elif domain == "uint8":
        raise ValueError(f"{kind}(value='random') on a uint8 image: the cast of noise past uint8's range is "
                         "undefined; not lowered")
    log_ratio = op._log_ratio if v2 else torch.log(torch.tensor(op.ratio))  # v2's, as its constructor made it
    lo, hi = (float(x) for x in log_ratio[:2])
    s0, s1 = (float(x) for x in op.scale[:2])
    if not (0 <= s0 <= s1 <= 1 and -np.inf < lo <= hi < np.inf):  # (torch's uniform_ raises on a bad range)
        raise ValueError(f"{kind} with scale {op.scale} and ratio {op.ratio}: torchvision raises; not lowered")
    return Erase(float(op.p), (s0, s1), (lo, hi), value, at)


def lowered_timm(op: Any, domain: str, at: int) -> Erase:
    """The Erase of timm's RandomErasing `op` (`timm.data.random_erasing`) on what the ops before
    it give, after `at` tensor steps; ValueError, saying why, where fastdata has none."""
    kind = "timm's RandomErasing"
    if domain != "float":
        raise ValueError(f"{kind} of a {'PIL image' if domain == 'pil' else 'uint8 tensor'}: timm erases the "
                         "normalized float image; not lowered")
    if torch.device(op.device).type != "cpu":
        raise ValueError(f"{kind} on device {op.device!r}: fastdata erases on the CPU, as create_transform's "
                         "(device='cpu') does; not lowered")
    lo, hi = (float(x) for x in op.log_aspect_ratio)
    counts = (int(op.min_count), int(op.max_count))
    if not (0 <= op.min_area <= op.max_area and -np.inf < lo <= hi < np.inf and 1 <= counts[0] <= counts[1]):
        raise ValueError(f"{kind} with area ({op.min_area}, {op.max_area}), log-aspect ({lo}, {hi}) and count "
                         f"{counts}: not lowered")
    if counts[1] > _MAX_COUNT:
        raise ValueError(f"{kind} with max_count {counts[1]}: fastdata lowers at most {_MAX_COUNT}")
    mode = "pixel" if op.per_pixel else "rand" if op.rand_color else "const"
    return Erase(float(op.probability), (float(op.min_area), float(op.max_area)), (lo, hi),
                 (0.0,) if mode == "const" else None, at, counts, mode == "rand")


def _uniform(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """torch's float32 `uniform_(lo, hi)` for uniforms `u`: x * (to - from) + from in double, of
    float32 bounds, rounded to float32."""
    a, b = np.float32(lo), np.float32(hi)
    return (u * np.float64(b - a) + np.float64(a)).astype(np.float32)


def _placed(area: np.ndarray, aspect: np.ndarray, u_top: np.ndarray, u_left: np.ndarray, img_h: int,
            img_w: int) -> tuple[np.ndarray, ...]:
    """(found, i, j, h, w), each [N]: of the (area, aspect) attempts [N, 10], the first whose
    `int(round(sqrt(...)))` sides are under the image's, and its top-left as randint(0, img_h - h)
    and randint(0, img_w - w) draw it from the uniforms u_top and u_left [N]; where none is, not
    found and (0, 0, img_h, img_w), the image left as it is."""
    h, w = np.rint(np.sqrt(area * aspect)), np.rint(np.sqrt(area / aspect))  # (round half to even, as Python's)
    fits = (h < img_h) & (w < img_w)
    pick = np.arange(len(fits)), fits.argmax(axis=1)
    found = fits[pick]
    h = np.where(found, h[pick], img_h).astype(np.int64)
    w = np.where(found, w[pick], img_w).astype(np.int64)
    span_i, span_j = img_h - h + 1, img_w - w + 1  # randint(0, span - 1): min(int(u * span), span - 1)
    i = np.minimum((u_top * span_i).astype(np.int64), span_i - 1)
    j = np.minimum((u_left * span_j).astype(np.int64), span_j - 1)
    return found, np.where(found, i, 0), np.where(found, j, 0), h, w


def params(op: Erase, u: np.ndarray, img_h: int, img_w: int) -> tuple[np.ndarray, np.ndarray]:
    """(bool [N]: the p test passed, int64 [N, 4]: (i, j, h, w)) from uniforms `u` [N, _DRAWS],
    as torchvision's RandomErasing draws them (`_placed`, its uniforms torch's float32 ones)."""
    area = img_h * img_w * _uniform(u[:, 1:1 + 2 * _ATTEMPTS:2], *op.scale).astype(np.float64)
    aspect = np.exp(_uniform(u[:, 2:2 + 2 * _ATTEMPTS:2], *op.log_ratio)).astype(np.float64)
    _, i, j, h, w = _placed(area, aspect, u[:, -2], u[:, -1], img_h, img_w)
    return u[:, 0] < op.p, np.stack([i, j, h, w], axis=1)


def timm_rows(op: Erase, u: np.ndarray, img_h: int, img_w: int) -> np.ndarray:
    """int64 [m, 5] rows of (sample, i, j, h, w) from uniforms `u` [N, op.draws], as timm's
    `_erase` draws them with Python's RNG: the p test (erased unless random() > p), the count,
    then per rectangle `_placed` of 10 (area / count, log-aspect) attempts; in the order timm
    writes them (a later one over an earlier), without those that erase nothing."""
    lo, hi = op.count
    count = lo + np.minimum((u[:, 1] * (hi - lo + 1)).astype(np.int64), hi - lo)  # randint(lo, hi)
    rows = []
    for slot in range(hi):
        v = u[:, 2 + slot * (_DRAWS - 1):2 + (slot + 1) * (_DRAWS - 1)]
        # (Python's uniform(a, b) is a + (b - a) * random(), in double)
        area = (op.scale[0] + (op.scale[1] - op.scale[0]) * v[:, 0:2 * _ATTEMPTS:2]) * (img_h * img_w) / count[:, None]
        aspect = np.exp(op.log_ratio[0] + (op.log_ratio[1] - op.log_ratio[0]) * v[:, 1:2 * _ATTEMPTS:2])
        found, i, j, h, w = _placed(area, aspect, v[:, -2], v[:, -1], img_h, img_w)
        keep = (u[:, 0] <= op.p) & (slot < count) & found & (h > 0) & (w > 0)
        rows.append(np.stack([np.arange(len(u)), i, j, h, w], axis=1)[keep])
    rows = np.concatenate(rows)
    return rows[np.argsort(rows[:, 0], kind="stable")]


def draw(erasing: tuple, seed: int, indices: np.ndarray, img_h: int, img_w: int) -> tuple:
    """Per Erase of `erasing`, (it, the rectangles it erases in the batch of samples `indices`,
    images of img_h x img_w, drawn from the batch's `seed`: the bytes of int64 [m, 5] rows of
    (sample, i, j, h, w)); a sample not erased, or whose rectangle is empty, has no row."""
    out = []
    for k, op in enumerate(erasing):
        u = uniforms(seed, 0, indices, _STREAM + k, op.draws)
        if op.count is not None:
            out.append((op, timm_rows(op, u, img_h, img_w).astype(np.int64).tobytes()))
            continue
        hit, rects = params(op, u, img_h, img_w)
        keep = np.flatnonzero(hit & (rects[:, 2] < img_h) & (rects[:, 2] > 0) & (rects[:, 3] > 0))
        out.append((op, np.concatenate([keep[:, None], rects[keep]], axis=1).astype(np.int64).tobytes()))
    return tuple(out)


def erase(out: Any, steps: tuple, erased: tuple, seed: int, apply_steps: Callable) -> None:
    """Writes the rectangles of `erased` (`draw`'s) over `out` (the batch laid out through
    `steps`: NCHW, or a list of its CHW images), op after op in the script's order: each holds
    the op's value cast to the image's dtype at the op (uint8 before the conversion), then taken
    through the steps after it by `apply_steps` (the layout's: out CHW, image HWC, steps). The
    noise of value='random' is drawn from a generator seeded by the batch's `seed`, never from
    torch's global RNG."""
    noise = None
    for op, rects in erased:
        rows = np.frombuffer(rects, dtype=np.int64).reshape(-1, 5).tolist()
        if not rows:
            continue
        after, dtype = steps[op.at:], out[0].dtype
        if op.value is not None:
            converted = any(step[0] == "to" for step in steps[:op.at])
            v = torch.empty((3, 1, 1), dtype=dtype if converted else torch.uint8)
            v[...] = torch.tensor(list(op.value))[:, None, None]  # torchvision's `img[..., i:i+h, j:j+w] = v`
            fill = torch.empty((3, 1, 1), dtype=dtype)
            apply_steps(fill, v.permute(1, 2, 0), after)
            for k, i, j, h, w in rows:
                out[k][:, i:i + h, j:j + w] = fill
            continue
        if noise is None:
            noise = torch.Generator().manual_seed(seed)
        for k, i, j, h, w in rows:  # (after the conversion: `lowered` refuses noise on uint8)
            v = torch.empty((3, 1, 1) if op.per_channel else (3, h, w), dtype=torch.float32).normal_(generator=noise)
            v = v.expand(3, h, w)
            apply_steps(out[k][:, i:i + h, j:j + w], v.permute(1, 2, 0), after)
