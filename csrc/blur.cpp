// Compiled with -ffp-contract=off (CMakeLists.txt): the box radius and its weights are Pillow's
// float expressions, each product and sum rounded on its own as BoxBlur.c's are.
#include "blur.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "clones.h"

namespace fastdata {
namespace {

constexpr int64_t kStrip = 1024;  // (values a column pass carries at once: its sums stay in L1)

// One row of a box pass: n sums moved on by a row (add in, sub out), each weighted into a byte.
FASTDATA_AVX2_CLONE void box_row(const uint8_t* __restrict add, const uint8_t* __restrict sub,
                                 const uint8_t* __restrict far, uint32_t* __restrict acc, uint8_t* __restrict o,
                                 int64_t n, uint32_t ww, uint32_t fw) {
  for (int64_t l = 0; l < n; ++l) {
    const uint32_t a = acc[l] + uint32_t(add[l]) - uint32_t(sub[l]);  // (mod 2^32: the exact sum)
    acc[l] = a;
    const uint32_t bulk = a * ww + (uint32_t(sub[l]) + uint32_t(far[l])) * fw;
    o[l] = uint8_t((bulk + (1u << 23)) >> 24);
  }
}

// One box along the columns of rows x lanes bytes: out[y] = the window y - r - 1 .. y + r + 1 of
// in (rows clamped to the edges), the r + r + 1 inner rows weighted ww, the two outer fw.
void column_pass(const uint8_t* in, uint8_t* out, int rows, int64_t lanes, int radius, uint32_t ww, uint32_t fw) {
  const int last = rows - 1;
  auto row = [&](int y) { return in + int64_t(std::clamp(y, 0, last)) * lanes; };
  uint32_t acc[kStrip];
  for (int64_t l0 = 0; l0 < lanes; l0 += kStrip) {
    const int64_t n = std::min(kStrip, lanes - l0);
    // The sum for y = -1: rows -1 - r .. r - 1, clamped (in O(rows) whatever r is)
    const uint8_t* first = row(0) + l0;
    for (int64_t l = 0; l < n; ++l) acc[l] = uint32_t(first[l]) * uint32_t(radius + 1);
    const int inside = std::min(radius - 1, last);
    for (int y = 0; y <= inside; ++y) {
      const uint8_t* p = row(y) + l0;
      for (int64_t l = 0; l < n; ++l) acc[l] += p[l];
    }
    if (radius - 1 > last) {
      const uint8_t* p = row(last) + l0;
      const uint32_t times = uint32_t(radius - 1 - last);
      for (int64_t l = 0; l < n; ++l) acc[l] += uint32_t(p[l]) * times;
    }
    for (int y = 0; y < rows; ++y) {
      box_row(row(y + radius) + l0, row(y - radius - 1) + l0, row(y + radius + 1) + l0, acc,
              out + int64_t(y) * lanes + l0, n, ww, fw);
    }
  }
}

// `passes` boxes of `radius` along the columns of rows x lanes bytes, from `src` into `dst`;
// `spare` (the same size) holds the passes between.
void column_passes(const uint8_t* src, uint8_t* dst, uint8_t* spare, int rows, int64_t lanes, float radius,
                   int passes) {
  // BoxBlur.c's weights: float division, truncated; the outer pair's share of what is left
  const int r = int(radius);
  const uint32_t ww = uint32_t(float(uint32_t(1) << 24) / (radius * 2 + 1));
  const uint32_t fw = ((uint32_t(1) << 24) - uint32_t(r * 2 + 1) * ww) / 2;
  // The last pass lands in dst: with an odd count the first goes to dst, an even one to spare.
  uint8_t* bufs[2] = {passes % 2 ? dst : spare, passes % 2 ? spare : dst};
  const uint8_t* in = src;
  for (int i = 0; i < passes; ++i) {
    column_pass(in, bufs[i % 2], rows, lanes, r, ww, fw);
    in = bufs[i % 2];
  }
}

// out (w x h pixels of C bytes) = in (h x w) transposed, in tiles that stay in cache.
template <int C>
void transpose_pixels(const uint8_t* in, uint8_t* out, int h, int w) {
  constexpr int kTile = 32;
  for (int y0 = 0; y0 < h; y0 += kTile) {
    for (int x0 = 0; x0 < w; x0 += kTile) {
      const int y1 = std::min(h, y0 + kTile), x1 = std::min(w, x0 + kTile);
      for (int x = x0; x < x1; ++x) {
        uint8_t* o = out + (int64_t(x) * h + y0) * C;
        const uint8_t* p = in + (int64_t(y0) * w + x) * C;
        for (int y = y0; y < y1; ++y, o += C, p += int64_t(w) * C) std::memcpy(o, p, C);
      }
    }
  }
}

void transpose(const uint8_t* in, uint8_t* out, int h, int w, int c) {
  (c == 3 ? transpose_pixels<3> : transpose_pixels<1>)(in, out, h, w);
}

}  // namespace

float gaussian_box_radius(float radius, int passes) {
  // BoxBlur.c's _gaussian_blur_radius, its float and double steps as they are there
  float sigma2, L, l, a;
  sigma2 = radius * radius / float(passes);
  L = float(std::sqrt(12.0 * double(sigma2) + 1.0));
  l = float(std::floor((double(L) - 1.0) / 2.0));
  a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
  a /= 6 * (sigma2 - (l + 1) * (l + 1));
  return l + a;
}

bool box_radius_ok(float radius) { return radius >= 0 && radius < 65536.0f; }

void box_blur(const uint8_t* src, uint8_t* out, int h, int w, int channels, float xradius, float yradius,
              int passes) {
  const int64_t size = int64_t(h) * w * channels;
  if (size == 0) return;
  if (xradius == 0 && yradius == 0) {
    std::memcpy(out, src, size_t(size));
    return;
  }
  std::vector<uint8_t> a(static_cast<size_t>(size)), b(static_cast<size_t>(size));
  const uint8_t* rows = src;  // (the image after the passes along its rows)
  if (xradius != 0) {
    transpose(src, a.data(), h, w, channels);
    column_passes(a.data(), b.data(), out, w, int64_t(h) * channels, xradius, passes);
    transpose(b.data(), yradius != 0 ? a.data() : out, w, h, channels);
    rows = a.data();
  }
  if (yradius != 0) column_passes(rows, out, b.data(), h, int64_t(w) * channels, yradius, passes);
}

}  // namespace fastdata
