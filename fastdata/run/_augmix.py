"""`fastdata run`'s AugMix (torchvision's v1 and v2 classes) on the PIL image or a uint8 tensor:
read from the script's op (`augmix`), and run per sample as torchvision's `forward` runs it,
with its own kernels: the image as a uint8 tensor, `mixture_width` chains of 1 to 3 of its ops,
each at a magnitude of its table, mixed with the image by Dirichlet weights, back to uint8.

torchvision draws the weights, depths, ops, magnitudes and signs from torch's global RNG. Here
they come, in the very calls and order of the op's class, from a generator of the sample's own,
seeded from the sample's draws (`plan`): each sample a function of its batch's seed and its
place, as fastdata's other pixel ops, and the training process's RNG untouched by the threads
that decode. The same seed in torch's global RNG gives torchvision's own op the same image
(`tests/contract/test_torchvision_faithful.py`). Each op is fastdata's twin of torchvision's
kernel where it has one (`_kernels`: the enhance and table ops, the translations; each checked
once a process against the torchvision that runs), else torchvision's own call
(`autoaugment._apply_op`, v2's `_apply_image_or_video_transform`: the rotation, the shears, and
v2's blends). The chains are written here, no library giving AugMix's chains with a generator,
and mixed by the extension's `mix_add` (each product and sum rounded as torch's operations round
them), the result laid out as torchvision's.
A folder's lowering runs it as a pixel op after the decoder's geometry (`_lowering`), before
the layout's tensor steps (on a uint8 image, the same values as after the conversion).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._ext import native
from ..transforms import ops as fd
from ._kernels import run_op


@functools.lru_cache(maxsize=8)
def _torchvisions(v2: bool, severity: int, width: int, depth: int, alpha: float, all_ops: bool,
                  interpolation: Any, fill: Any) -> Any:
    """torchvision's AugMix of these parameters (its op table and kernels), one a process."""
    if v2:
        from torchvision.transforms.v2 import AugMix
    else:
        from torchvision.transforms import AugMix
    fill = list(fill) if isinstance(fill, tuple) else fill  # (held as a tuple; its kernels take either alike)
    return AugMix(severity, width, depth, alpha, all_ops, interpolation, fill)


@dataclass(frozen=True)
class AugMix(fd.Op):
    """torchvision's AugMix on the PIL image, its parameters as the script's op holds them."""

    v2: bool
    severity: int
    mixture_width: int
    chain_depth: int
    alpha: float
    all_ops: bool
    interpolation: Any  # torchvision's InterpolationMode (v2: or the name or PIL int it was given)
    fill: Any  # None, a number or a tuple

    def plan(self, u: Any) -> list[dict]:
        # (a 64-bit seed from two of the sample's uniforms)
        return [{"seed": int(a * 2 ** 32) << 32 | int(b * 2 ** 32)} for a, b in u[:, :2]]

    def on_pillow(self, img: Any, p: dict) -> Any:
        from torchvision.transforms.functional import pil_to_tensor, to_pil_image

        tv = _torchvisions(self.v2, self.severity, self.mixture_width, self.chain_depth, self.alpha, self.all_ops,
                           self.interpolation, self.fill)
        return to_pil_image(self.mix(tv, pil_to_tensor(img), torch.Generator().manual_seed(p["seed"])))

    def mix(self, tv: Any, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """torchvision's `forward` on one CHW uint8 image, its draws from `g`."""
        height, width = image.shape[-2:]
        if self.v2:
            space = tv._AUGMENTATION_SPACE if tv.all_ops else tv._PARTIAL_AUGMENTATION_SPACE
        else:
            space = tv._augmentation_space(tv._PARAMETER_MAX, (height, width))
        names = list(space)
        batch = image.reshape([1] * max(4 - image.ndim, 0) + list(image.shape))
        dims = [batch.size(0)] + [1] * (batch.ndim - 1)
        m = torch._sample_dirichlet(torch.tensor([tv.alpha, tv.alpha]).expand(dims[0], -1), generator=g)
        weights = torch._sample_dirichlet(torch.tensor([tv.alpha] * tv.mixture_width).expand(dims[0], -1),
                                          generator=g) * m[:, 1].reshape([dims[0], -1])
        # The mixing: natively for one image (`mix_add`: each product and sum rounded as torch's),
        # else torch's operations
        acc = np.empty(batch.numel(), np.float32) if len(batch) == 1 and hasattr(native, "mix_add") else None
        if acc is not None:
            native.mix_add(acc, _values(batch), float(m[0, 0]), True)
        else:
            mix = m[:, 0].reshape(dims) * batch
        for i in range(tv.mixture_width):
            aug = batch
            depth = tv.chain_depth if tv.chain_depth > 0 else int(torch.randint(1, 4, (1,), generator=g).item())
            for _ in range(depth):
                if self.v2:
                    name = names[int(torch.randint(len(names), (), generator=g))]
                    magnitudes_of, signed = space[name]
                    magnitudes, magnitude = magnitudes_of(tv._PARAMETER_MAX, height, width), 0.0
                    if magnitudes is not None:
                        magnitude = float(magnitudes[int(torch.randint(tv.severity, (), generator=g))])
                        if signed and torch.rand((), generator=g) <= 0.5:
                            magnitude *= -1
                    aug = run_op(self.v2, tv, aug, name, magnitude, tv.fill)
                else:
                    name = names[int(torch.randint(len(names), (1,), generator=g).item())]
                    magnitudes, signed = space[name]
                    magnitude = float(magnitudes[torch.randint(tv.severity, (1,), dtype=torch.long,
                                                               generator=g)].item()) if magnitudes.ndim > 0 else 0.0
                    if signed and torch.randint(2, (1,), generator=g):
                        magnitude *= -1.0
                    aug = run_op(self.v2, tv, aug, name, magnitude, tv.fill)
            if acc is not None:
                native.mix_add(acc, _values(aug), float(weights[0, i]), False)
            else:
                mix.add_(weights[:, i].reshape(dims) * aug)
        if acc is not None:  # (truncated to bytes, laid out as the image, as torch's mix would be)
            return torch.empty_like(image).copy_(torch.from_numpy(acc.astype(np.uint8)).view(image.shape))
        return mix.reshape(image.shape).to(dtype=image.dtype)

def _values(image: torch.Tensor) -> np.ndarray:
    """A uint8 image's values in [..., C, H, W] order, contiguous (a copy where it is laid out otherwise)."""
    return image.contiguous().view(-1).numpy()


def augmix(op: Any, domain: str) -> AugMix:
    """AugMix's lowering for images of `domain` ("pil", "uint8" or "float"); ValueError, saying
    why, where there is none. On the PIL image (where the references' presets put it) or a uint8
    tensor: torchvision runs its tensor kernels on either, the PIL image converted losslessly
    first; a float tensor it refuses."""
    import torchvision.transforms.v2 as v2

    kind, fill = type(op).__name__, op.fill
    if domain == "float":
        raise ValueError(f"{kind} on a float tensor: torchvision refuses it; not lowered")
    if isinstance(fill, dict) or (fill is not None and not isinstance(fill, (int, float, list, tuple))):
        raise ValueError(f"{kind} with a fill per type: not lowered")
    counts = (op.severity, op.mixture_width, op.chain_depth)
    if not all(type(n) is int for n in counts) or op.mixture_width < 1 or type(op.alpha) is not float:
        # (torchvision's own op runs, or raises, on what else it is given)
        raise ValueError(f"{kind} with severity, mixture_width, chain_depth {counts} and alpha {op.alpha!r}: "
                         "fastdata lowers ints (a mixture_width of at least 1) and a float alpha")
    return AugMix(type(op) is v2.AugMix, op.severity, op.mixture_width, op.chain_depth, op.alpha, bool(op.all_ops),
                  op.interpolation, tuple(fill) if isinstance(fill, (list, tuple)) else fill)
