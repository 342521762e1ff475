// Pillow's affine transform (Image.transform(size, AFFINE, data, resample), what Image.rotate and
// torchvision's F.affine and auto-augments call on a PIL image) in one pass over uint8 pixels,
// with the arithmetic of Pillow's Geometry.c step by step, so that every pixel equals Pillow's
// (tests/unit/test_geometry.py compares them over shears, translations, rotations and scalings):
//
// - nearest: a map with no rotation or shear (data[1] == data[3] == 0) steps through the source
//   in doubles, one increment a column and a row; any other whose four corners map inside
//   +-32768 steps in 16.16 fixed point; the rest in doubles again, from the top-left pixel's centre.
// - bilinear and bicubic: each output pixel's centre mapped through the data, its neighbours
//   clipped to the image, weighted in doubles; bilinear's result truncated, bicubic's clipped to
//   0..255 first.
//
// An output pixel whose source falls outside the image keeps `fill` (Pillow's fillcolor).
#pragma once
#include <cstdint>

namespace fastdata {

// src: h x w pixels of `channels` uint8 (1 or 3), rows contiguous; out: oh x ow of the same;
// data: Pillow's six AFFINE coefficients (output pixel centre (x, y) -> source (a x + b y + c,
// d x + e y + f)); resample: Pillow's filter number, 0 nearest, 2 bilinear, 3 bicubic; fill: one
// value a channel.
void affine(const uint8_t* src, int w, int h, int channels, uint8_t* out, int ow, int oh, const double data[6],
            int resample, const uint8_t* fill);

}  // namespace fastdata
