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

}  // namespace fastdata
