// Pillow's GaussianBlur (ImageFilter.GaussianBlur, Image.gaussian_blur: BoxBlur.c) of uint8
// pixels, value for value: the Gaussian's radius turned into an extended box's (Gwosdek et al.,
// in Pillow's float steps), then `passes` boxes along rows, then as many along columns, each a
// window of clamped-edge sums in 32-bit integers weighted in 24-bit fixed point and rounded to
// bytes. Pillow runs a line at a time; here the columns' passes run across a row's values at
// once (vectors), and the rows' on the transposed image, which gives the same sums.
#pragma once
#include <cstdint>

namespace fastdata {

// The box radius Pillow's ImagingGaussianBlur gives a Gaussian of `radius` in `passes` boxes.
float gaussian_box_radius(float radius, int passes);

// Whether `box_blur` takes a box radius: finite, from 0 to under 65536 (Pillow's int sums hold
// such a window's; beyond, its arithmetic overflows, and the caller leaves the blur to Pillow).
bool box_radius_ok(float radius);

// src: h x w pixels of `channels` uint8 (1 or 3), rows contiguous; out: the same shape, not
// overlapping src. xradius, yradius: box radii (`box_radius_ok`), 0 for no pass that way.
void box_blur(const uint8_t* src, uint8_t* out, int h, int w, int channels, float xradius, float yradius,
              int passes);

}  // namespace fastdata
