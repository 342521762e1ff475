"""`fastdata run`'s auto-augments on a uint8 tensor image: torchvision's TrivialAugmentWide,
RandAugment and AutoAugment (v1 and v2 classes) after PILToTensor or ToImage, as the references'
`--backend tensor` presets and v2's tensor-first pipelines place them.

On a tensor, torchvision computes every op with its tensor kernels, whose pixels are not
Pillow's (on the PIL image fastdata's own ops, Pillow's, run them: `transforms.pil`). So each
sample runs the class's `forward` as torchvision writes it (`TensorAugment.forward`): the ops,
magnitudes and signs drawn in the very calls and order of the class, from a generator of the
sample's own seeded from the sample's draws (`plan`), as `_augmix` does; each op fastdata's twin
of torchvision's kernel where it has one (`_kernels`: the enhance and table ops, the
translations; each checked once a process against the torchvision that runs), else
torchvision's own call (`autoaugment._apply_op`, v2's `_apply_image_or_video_transform`: the
shears, the rotation, v2's blends). The same seed in torch's global RNG gives torchvision's own
op the same image (`tests/contract/test_torchvision_faithful.py`). The forward is written here
because torchvision's draws from the global RNG, which the threads that decode must not share.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..transforms import ops as fd
from ._kernels import run_op


@functools.lru_cache(maxsize=8)
def _torchvisions(kind: str, v2: bool, params: tuple) -> Any:
    """torchvision's op of this kind and these parameters (its tables and kernels), one a process."""
    if v2:
        import torchvision.transforms.v2 as T
    else:
        import torchvision.transforms as T
    kwargs = {name: list(value) if isinstance(value, tuple) else value for name, value in params}
    return getattr(T, kind)(**kwargs)


@dataclass(frozen=True)
class TensorAugment(fd.Op):
    """torchvision's auto-augment `kind` on the uint8 tensor image, its parameters as the script's
    op holds them (`params`: (name, value) pairs, a list held as a tuple)."""

    kind: str
    v2: bool
    params: tuple
    tensor = True  # (`transforms.pil.pixel_ops_on` hands it the tensor image)

    def plan(self, u: Any) -> list[dict]:
        # (a 64-bit seed from two of the sample's uniforms)
        return [{"seed": int(a * 2 ** 32) << 32 | int(b * 2 ** 32)} for a, b in u[:, :2]]

    def on_tensor(self, image: torch.Tensor, p: dict) -> torch.Tensor:
        tv = _torchvisions(self.kind, self.v2, self.params)
        return self.forward(tv, image, torch.Generator().manual_seed(p["seed"]))

    def forward(self, tv: Any, img: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """torchvision's `forward` of `tv` on one CHW uint8 image, its draws from `g`."""
        height, width = img.shape[-2:]
        if self.v2:
            space = tv._AUGMENTATION_SPACE
            if self.kind == "AutoAugment":
                for name, probability, index in tv._policies[int(torch.randint(len(tv._policies), (), generator=g))]:
                    if torch.rand((), generator=g) <= probability:
                        img = self._v2_op(tv, img, name, index, space, g)
                return img
            for _ in range(tv.num_ops if self.kind == "RandAugment" else 1):
                keys = tuple(space)
                name = keys[int(torch.randint(len(keys), (), generator=g))]
                img = self._v2_op(tv, img, name, tv.magnitude if self.kind == "RandAugment" else None, space, g)
            return img
        fill = tv.fill
        if isinstance(fill, (int, float)):  # (v1's forward hands its tensor kernels a float per channel)
            fill = [float(fill)] * img.shape[-3]
        elif fill is not None:
            fill = [float(f) for f in fill]
        if self.kind == "AutoAugment":
            transform_id = int(torch.randint(len(tv.policies), (1,), generator=g).item())
            probs, signs = torch.rand((2,), generator=g), torch.randint(2, (2,), generator=g)
            meta = tv._augmentation_space(10, (height, width))
            for i, (name, p, index) in enumerate(tv.policies[transform_id]):
                if probs[i] <= p:
                    magnitudes, signed = meta[name]
                    magnitude = float(magnitudes[index].item()) if index is not None else 0.0
                    if signed and signs[i] == 0:
                        magnitude *= -1.0
                    img = run_op(self.v2, tv, img, name, magnitude, fill)
            return img
        rand = self.kind == "RandAugment"
        meta = tv._augmentation_space(tv.num_magnitude_bins, (height, width)) if rand else \
            tv._augmentation_space(tv.num_magnitude_bins)
        for _ in range(tv.num_ops if rand else 1):
            name = list(meta.keys())[int(torch.randint(len(meta), (1,), generator=g).item())]
            magnitudes, signed = meta[name]
            if magnitudes.ndim == 0:
                magnitude = 0.0
            elif rand:
                magnitude = float(magnitudes[tv.magnitude].item())
            else:
                magnitude = float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long,
                                                           generator=g)].item())
            if signed and torch.randint(2, (1,), generator=g):
                magnitude *= -1.0
            img = run_op(self.v2, tv, img, name, magnitude, fill)
        return img

    def _v2_op(self, tv: Any, img: torch.Tensor, name: str, index: int | None, space: dict,
               g: torch.Generator) -> torch.Tensor:
        """One op of v2's forward: its magnitude (at `index`; TrivialAugmentWide's drawn) and sign."""
        magnitudes_of, signed = space[name]
        magnitudes = magnitudes_of(10 if self.kind == "AutoAugment" else tv.num_magnitude_bins, *img.shape[-2:])
        magnitude = 0.0
        if magnitudes is not None:
            if self.kind == "TrivialAugmentWide":
                index = int(torch.randint(tv.num_magnitude_bins, (), generator=g))
            magnitude = float(magnitudes[index])
            if signed and torch.rand((), generator=g) <= 0.5:
                magnitude *= -1
        return run_op(self.v2, tv, img, name, magnitude, None)


def tensor_augment(op: Any, domain: str) -> TensorAugment:
    """The lowering of torchvision's TrivialAugmentWide, RandAugment or AutoAugment `op` on a
    tensor image of `domain` ("uint8" or "float"); ValueError, saying why, where there is none."""
    kind, fill = type(op).__name__, op.fill
    if domain == "float":
        raise ValueError(f"{kind} on a float tensor: fastdata lowers it on a uint8 one")
    if isinstance(fill, dict) or (fill is not None and not isinstance(fill, (int, float, list, tuple))):
        raise ValueError(f"{kind} with a fill per type: not lowered")
    names = {"TrivialAugmentWide": ("num_magnitude_bins",), "AutoAugment": ("policy",),
             "RandAugment": ("num_ops", "magnitude", "num_magnitude_bins")}[kind]
    counts = [getattr(op, name) for name in names if name != "policy"]
    if not all(type(n) is int for n in counts):  # (torchvision's own op runs, or raises, on what else it is given)
        raise ValueError(f"{kind} with {', '.join(names)} {counts}: fastdata lowers ints")
    params = tuple((name, getattr(op, name)) for name in names) + (
        ("interpolation", op.interpolation), ("fill", tuple(fill) if isinstance(fill, (list, tuple)) else fill))
    return TensorAugment(kind, type(op).__module__.startswith("torchvision.transforms.v2"), params)
