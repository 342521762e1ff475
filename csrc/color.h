// Pillow's hue shift (ColorJitter's hue on a PIL image) in one pass: RGB to HSV, the hue moved
// by a whole number of levels modulo 256, HSV back to RGB, each conversion with the very
// arithmetic of Pillow's Convert.c (its float and double steps in its order), so that every
// pixel equals Pillow's (tests/unit/test_color_jitter.py compares all 2^24 colours both ways).
#pragma once
#include <cstdint>

namespace fastdata {

// src and dst: n pixels of 3 uint8 (RGB), contiguous (dst may be src); shift: 0..255.
void hue_shift(const uint8_t* src, uint8_t* dst, int64_t n, int shift);

// The two conversions alone (for the tests against Pillow's convert("HSV") and convert("RGB")).
void rgb_to_hsv(const uint8_t* src, uint8_t* dst, int64_t n);
void hsv_to_rgb(const uint8_t* src, uint8_t* dst, int64_t n);

// Pillow's ImageEnhance on an RGB image, `Image.blend(degenerate, image, alpha)` with ImagingBlend's
// float arithmetic (interpolated between 0 and 1, else extrapolated and clipped, each value
// truncated): kind 0 Brightness (degenerate black), 1 Contrast (grey at the image's mean "L"
// level, rounded), 2 Color (each pixel's own "L" level). "L" is convert("L")'s ITU-R 601-2 in
// fixed point: (R * luma.r + G * luma.g + B * luma.b + half) >> luma.shift, Pillow's weights
// (16 bits) or Pillow-SIMD's (15). Pillow-SIMD converts `lanes` (4) pixels at a time and leaves
// the last width % lanes pixels of each row to its C code, with Pillow's weights: with lanes > 0,
// those pixels of each row of `width` take Pillow's weights here too. src and dst: n pixels of 3
// uint8, rows of `width` (0: one row), contiguous (dst may be src).
struct Luma {
  int r = 19595, g = 38470, b = 7471, shift = 16;
  int lanes = 0;
};
void enhance(const uint8_t* src, uint8_t* dst, int64_t n, int kind, float alpha, Luma luma = Luma(),
             int64_t width = 0);

// Pillow's ImageEnhance.Sharpness on an RGB image of w x h pixels: the blend over the image's
// filter(SMOOTH), Filter.c's 3x3 pass in float (the kernel 1 1 1 / 1 5 1 / 1 1 1 each divided by
// 13 as a float, 0.5 first, then the rows below, at and above each pixel, each row's three
// products summed left to right; clipped, truncated; the border pixels, and an image under 3
// pixels a side, kept). dst may be src.
void sharpness(const uint8_t* src, uint8_t* dst, int w, int h, float alpha);

// torchvision's tensor kernels (transforms._functional_tensor's, v1) of Brightness (kind 0),
// Contrast (1), Color (2: adjust_saturation, C = 3) and Sharpness (3: H and W at least 3) on a
// uint8 image [C, H, W] (C 1 or 3), each value as torch's float32 operations give it: _blend's
// ratio * image + (1 - ratio) * degenerate, each product and the sum rounded (ratio and 1 - ratio
// computed in double, each rounded to float), clamped to 0..255, truncated. The degenerate:
// black; the mean of the image's grayscale (the grayscale truncated; float(sum) / float(count),
// the sum exact while H x W x 255 is under 2^24, which the caller checks); each pixel's
// grayscale, (0.2989 r + 0.587 g) + 0.114 b, each step rounded, truncated; the image smoothed by
// the 3x3 kernel 1 1 1 / 1 5 1 / 1 1 1 over 13 and rounded (conv2d's sum of 13ths is never within
// float32's error of a half, so this is (S + 6) / 13 in integers), its border the image's own.
// Brightness is v2's kernel too (image * ratio). dst apart from src.
void tensor_enhance(const uint8_t* src, uint8_t* dst, int c, int h, int w, int kind, double factor);

}  // namespace fastdata
