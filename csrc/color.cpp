// Compiled with -ffp-contract=off (a fused multiply-add would round once where Pillow's code
// rounds twice) and -fno-trapping-math (no FP exception is ever read; it lets the compiler turn
// the selects below into vector blends): CMakeLists.txt. Pillow's library calls are replaced only
// where the result is the same for every input they get here: fmod(x, 1.0) of x in [0, 2) is x
// or x - 1 (exact); floor of a non-negative double is its integer part, and round that plus one
// where the remainder is >= 0.5. A byte converted to float and then to double is the byte.
//
// Pixels go through in chunks of planes, each step a loop of selects with no branch (which
// channel is the largest, which sixth of the hue circle: unpredictable on natural images), which
// the compiler vectorizes; on x86-64 with glibc, each loop also has an AVX2 clone, picked at
// load time where the CPU has AVX2 (the baseline's SSE2 lacks the int/double
// conversions the HSV -> RGB loop needs in vectors).
#include "color.h"

#include <algorithm>
#include <vector>

#include "clones.h"

namespace fastdata {
namespace {

constexpr int kChunk = 256;

// Pillow's rgb2hsv_row for n pixels: r, g, b (bytes, as floats) -> h, s, v bytes.
FASTDATA_AVX2_CLONE void hsv_planes(const float* __restrict r, const float* __restrict g, const float* __restrict b,
                                    int32_t* __restrict h, int32_t* __restrict s, int32_t* __restrict v, int n) {
  for (int j = 0; j < n; ++j) {
    const float R = r[j], G = g[j], B = b[j];
    const float mx = std::max(std::max(R, G), B), mn = std::min(std::min(R, G), B);
    const float cr = mx - mn;
    const bool grey = cr == 0.0f;  // (then both h and s are 0; the divisions below are by 1)
    const float over = grey ? 1.0f : cr;
    const float sat = cr / (grey ? 1.0f : mx);
    const float rc = (mx - R) / over, gc = (mx - G) / over, bc = (mx - B) / over;
    const float hr = bc - gc;
    const float hg = float(2.0 + double(rc) - double(bc));
    const float hb = float(4.0 + double(gc) - double(rc));
    const float hue = R == mx ? hr : (G == mx ? hg : hb);
    const double x = double(hue) / 6.0 + 1.0;  // in [5/6, 11/6)
    const int level = int(double(float(x >= 1.0 ? x - 1.0 : x)) * 255.0);  // in [0, 255): CLIP8 changes nothing
    h[j] = grey ? 0 : level;
    s[j] = int(double(sat) * 255.0);
    v[j] = int(mx);
  }
}

// Pillow's hsv2rgb for n pixels: h, s, v bytes -> r, g, b bytes. s = 0 needs no case of its own:
// fs = 0 makes p, q and t all v, Pillow's grey.
FASTDATA_AVX2_CLONE void rgb_planes(const int32_t* __restrict h, const int32_t* __restrict s,
                                    const int32_t* __restrict v, int32_t* __restrict r, int32_t* __restrict g,
                                    int32_t* __restrict b, int n) {
  for (int j = 0; j < n; ++j) {
    const double h6 = double(h[j]) * 6.0 / 255.0;
    const int i = int(h6);  // 0..6 (6 for h = 255, with f = 0: Pillow's switch takes i % 6)
    const float f = float(h6 - double(i));
    const float fs = float(double(s[j]) / 255.0);
    const double vf = double(v[j]);
    const double px = vf * (1.0 - double(fs));
    const double qx = vf * (1.0 - double(fs * f));
    const double tx = vf * (1.0 - double(fs) * (1.0 - double(f)));
    const int pi = int(px), qi = int(qx), ti = int(tx);
    const int p = pi + int(px - double(pi) >= 0.5);
    const int q = qi + int(qx - double(qi) >= 0.5);
    const int t = ti + int(tx - double(ti) >= 0.5);
    const int k = i - 6 * int(i == 6), vv = v[j];
    // Pillow's six cases: (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)
    const int c0 = -int(k == 0), c1 = -int(k == 1), c2 = -int(k == 2), c3 = -int(k == 3), c4 = -int(k == 4),
              c5 = -int(k == 5);
    r[j] = (vv & (c0 | c5)) | (q & c1) | (p & (c2 | c3)) | (t & c4);
    g[j] = (t & c0) | (vv & (c1 | c2)) | (q & c3) | (p & (c4 | c5));
    b[j] = (p & (c0 | c1)) | (t & c2) | (vv & (c3 | c4)) | (q & c5);
  }
}

// The planes of one chunk.
struct Chunk {
  float r[kChunk], g[kChunk], b[kChunk];
  int32_t x[kChunk], y[kChunk], z[kChunk];  // h, s, v
  int32_t o0[kChunk], o1[kChunk], o2[kChunk];  // r, g, b out

  template <typename T>
  static void split(const uint8_t* src, T* a0, T* a1, T* a2, int m) {
    for (int j = 0; j < m; ++j) a0[j] = T(src[3 * j]), a1[j] = T(src[3 * j + 1]), a2[j] = T(src[3 * j + 2]);
  }
  static void join(const int32_t* a0, const int32_t* a1, const int32_t* a2, uint8_t* dst, int m) {
    for (int j = 0; j < m; ++j) {
      dst[3 * j] = uint8_t(a0[j]), dst[3 * j + 1] = uint8_t(a1[j]), dst[3 * j + 2] = uint8_t(a2[j]);
    }
  }
};

template <typename Step>
void by_chunks(const uint8_t* src, uint8_t* dst, int64_t n, Step step) {
  Chunk c;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int m = int(std::min<int64_t>(kChunk, n - start));
    step(c, src + 3 * start, dst + 3 * start, m);
  }
}

// ImagingBlend's value of `value` over `base` (the degenerate image's): base + alpha * (value -
// base) in float, truncated; outside 0..1 Pillow clips first (t <= 0: 0, t >= 255: 255). Inside,
// t stays within 0..255, so one clamp serves both.
inline int32_t blended(int32_t base, int32_t value, float alpha) {
  float t = float(base) + alpha * float(value - base);
  t = t > 0.0f ? t : 0.0f;
  t = t < 255.0f ? t : 255.0f;
  return int32_t(t);
}

// m values, each blended over one level (Brightness, Contrast).
FASTDATA_AVX2_CLONE void blend_level(const uint8_t* src, uint8_t* dst, int64_t m, int32_t level, float alpha) {
  for (int64_t j = 0; j < m; ++j) dst[j] = uint8_t(blended(level, src[j], alpha));
}

// m values of a plane, each blended over its own base (Color: the pixel's "L").
FASTDATA_AVX2_CLONE void blend_plane(const int32_t* base, int32_t* plane, int m, float alpha) {
  for (int j = 0; j < m; ++j) plane[j] = blended(base[j], plane[j], alpha);
}

// convert("L")'s level of m pixels, (R * w.r + G * w.g + B * w.b + half) >> w.shift.
FASTDATA_AVX2_CLONE void luma_plane(const int32_t* r, const int32_t* g, const int32_t* b, int32_t* out, int m,
                                    Luma w) {
  const int32_t half = 1 << (w.shift - 1);
  for (int j = 0; j < m; ++j) out[j] = (r[j] * w.r + g[j] * w.g + b[j] * w.b + half) >> w.shift;
}

// One row of SMOOTH's pass over values i in [begin, end) of interleaved pixels (d values a pixel).
FASTDATA_AVX2_CLONE void smooth_row(const uint8_t* __restrict up, const uint8_t* __restrict mid,
                                    const uint8_t* __restrict down, uint8_t* __restrict out, int begin, int end,
                                    int d) {
  const float side = 1.0f / 13.0f, centre = 5.0f / 13.0f;
  for (int i = begin; i < end; ++i) {
    float ss = 0.5f;
    ss += float(down[i - d]) * side + float(down[i]) * side + float(down[i + d]) * side;
    ss += float(mid[i - d]) * side + float(mid[i]) * centre + float(mid[i + d]) * side;
    ss += float(up[i - d]) * side + float(up[i]) * side + float(up[i + d]) * side;
    ss = ss > 0.0f ? ss : 0.0f;
    out[i] = uint8_t(int32_t(ss < 255.0f ? ss : 255.0f));
  }
}

// n values blended over their own bases (Sharpness: the smoothed image's).
FASTDATA_AVX2_CLONE void blend_values(const uint8_t* __restrict base, const uint8_t* src, uint8_t* dst, int64_t n,
                                      float alpha) {
  for (int64_t j = 0; j < n; ++j) dst[j] = uint8_t(blended(base[j], src[j], alpha));
}

}  // namespace

void sharpness(const uint8_t* src, uint8_t* dst, int w, int h, float alpha) {
  const int64_t row = int64_t(w) * 3, n = row * h;
  std::vector<uint8_t> smooth(src, src + n);  // (the border, and a small image, as they are)
  if (w >= 3 && h >= 3) {
    for (int y = 1; y < h - 1; ++y) {
      smooth_row(src + (y - 1) * row, src + y * row, src + (y + 1) * row, smooth.data() + y * row, 3,
                 int(row) - 3, 3);
    }
  }
  blend_values(smooth.data(), src, dst, n, alpha);
}

void hue_shift(const uint8_t* src, uint8_t* dst, int64_t n, int shift) {
  by_chunks(src, dst, n, [shift](Chunk& c, const uint8_t* in, uint8_t* out, int m) {
    Chunk::split(in, c.r, c.g, c.b, m);
    hsv_planes(c.r, c.g, c.b, c.x, c.y, c.z, m);
    for (int j = 0; j < m; ++j) c.x[j] = (c.x[j] + shift) & 255;
    rgb_planes(c.x, c.y, c.z, c.o0, c.o1, c.o2, m);
    Chunk::join(c.o0, c.o1, c.o2, out, m);
  });
}

namespace {

// Calls step(first, count, weights) over the n pixels in runs that share their "L" weights: all
// of them, or (Pillow-SIMD's, lanes > 0) each row's whole groups of lanes with `w`, then its last
// width % lanes pixels with Pillow's own weights (see Luma).
template <typename Step>
void by_weights(int64_t n, int64_t width, Luma w, Step step) {
  if (w.lanes <= 0 || width <= 0 || width % w.lanes == 0) return step(int64_t(0), n, w);
  const int64_t tail = width % w.lanes, head = width - tail;
  for (int64_t row = 0; row < n; row += width) {
    const int64_t in_row = std::min(width, n - row);
    if (head > 0) step(row, std::min(head, in_row), w);
    if (in_row > head) step(row + head, in_row - head, Luma());
  }
}

}  // namespace

void enhance(const uint8_t* src, uint8_t* dst, int64_t n, int kind, float alpha, Luma w, int64_t width) {
  int32_t level = 0;  // Brightness: black; Contrast: ImageStat's mean of "L" (sum / count, in double) + 0.5, truncated
  if (kind == 1 && n > 0) {
    int64_t sum = 0;
    by_weights(n, width, w, [&](int64_t first, int64_t count, Luma weights) {
      by_chunks(src + 3 * first, dst + 3 * first, count, [&](Chunk& c, const uint8_t* in, uint8_t*, int m) {
        Chunk::split(in, c.x, c.y, c.z, m);  // (dst untouched)
        luma_plane(c.x, c.y, c.z, c.o0, m, weights);
        for (int j = 0; j < m; ++j) sum += c.o0[j];
      });
    });
    level = int32_t(double(sum) / double(n) + 0.5);
  }
  if (kind != 2) {  // every value blended with one level
    blend_level(src, dst, 3 * n, level, alpha);
    return;
  }
  by_weights(n, width, w, [&](int64_t first, int64_t count, Luma weights) {
    by_chunks(src + 3 * first, dst + 3 * first, count, [&](Chunk& c, const uint8_t* in, uint8_t* out, int m) {
      Chunk::split(in, c.x, c.y, c.z, m);
      luma_plane(c.x, c.y, c.z, c.o0, m, weights);
      for (int32_t* plane : {c.x, c.y, c.z}) blend_plane(c.o0, plane, m, alpha);
      Chunk::join(c.x, c.y, c.z, out, m);
    });
  });
}

void rgb_to_hsv(const uint8_t* src, uint8_t* dst, int64_t n) {
  by_chunks(src, dst, n, [](Chunk& c, const uint8_t* in, uint8_t* out, int m) {
    Chunk::split(in, c.r, c.g, c.b, m);
    hsv_planes(c.r, c.g, c.b, c.x, c.y, c.z, m);
    Chunk::join(c.x, c.y, c.z, out, m);
  });
}

void hsv_to_rgb(const uint8_t* src, uint8_t* dst, int64_t n) {
  by_chunks(src, dst, n, [](Chunk& c, const uint8_t* in, uint8_t* out, int m) {
    Chunk::split(in, c.x, c.y, c.z, m);
    rgb_planes(c.x, c.y, c.z, c.o0, c.o1, c.o2, m);
    Chunk::join(c.o0, c.o1, c.o2, out, m);
  });
}

namespace {

inline uint8_t clamp_truncated(float t) {
  t = t > 0.0f ? t : 0.0f;
  return uint8_t(int32_t(t < 255.0f ? t : 255.0f));
}

// _blend's r * a + q * b, each product and the sum rounded to float.
inline float blended(float a, float b, float r, float q) {
  const float x = r * a, y = q * b;
  return x + y;
}

// The grayscale of n pixels, (0.2989 r + 0.587 g) + 0.114 b, each step rounded, truncated.
FASTDATA_AVX2_CLONE void gray_plane(const uint8_t* __restrict r, const uint8_t* __restrict g,
                                    const uint8_t* __restrict b, uint8_t* __restrict out, int64_t n) {
  const float wr = 0.2989f, wg = 0.587f, wb = 0.114f;
  for (int64_t j = 0; j < n; ++j) {
    const float x = wr * float(r[j]), y = wg * float(g[j]), z = wb * float(b[j]);
    const float s = x + y;
    out[j] = uint8_t(int32_t(s + z));
  }
}

// n values blended with their own degenerates.
FASTDATA_AVX2_CLONE void blend_planes(const uint8_t* __restrict a, const uint8_t* __restrict b,
                                      uint8_t* __restrict out, int64_t n, float r, float q) {
  for (int64_t j = 0; j < n; ++j) out[j] = clamp_truncated(blended(float(a[j]), float(b[j]), r, q));
}

// One row of a plane smoothed by 1 1 1 / 1 5 1 / 1 1 1 over 13, rounded, for x in [1, w - 1).
FASTDATA_AVX2_CLONE void smoothed_row(const uint8_t* __restrict up, const uint8_t* __restrict mid,
                                      const uint8_t* __restrict down, uint8_t* __restrict out, int w) {
  for (int x = 1; x < w - 1; ++x) {
    const int32_t s = up[x - 1] + up[x] + up[x + 1] + mid[x - 1] + 5 * mid[x] + mid[x + 1] + down[x - 1] +
                      down[x] + down[x + 1];
    out[x] = uint8_t((s + 6) / 13);
  }
}

}  // namespace

void tensor_enhance(const uint8_t* src, uint8_t* dst, int c, int h, int w, int kind, double factor) {
  const int64_t plane = int64_t(h) * w, n = plane * c;
  const float r = float(factor), q = float(1.0 - factor);
  std::vector<uint8_t> other;
  if (kind == 0) {  // with black: r * value (+ q * 0 changes nothing)
    for (int64_t j = 0; j < n; ++j) dst[j] = clamp_truncated(r * float(src[j]));
    return;
  }
  if (kind == 1 || kind == 2) {
    other.resize(size_t(plane));
    if (c == 3) {
      gray_plane(src, src + plane, src + 2 * plane, other.data(), plane);
    } else {
      std::copy(src, src + plane, other.begin());
    }
  }
  if (kind == 1) {  // with the grayscale's mean, float(sum) / float(count): a table of the 256 values
    int64_t sum = 0;
    for (uint8_t v : other) sum += v;
    const float mean = float(sum) / float(plane);
    uint8_t table[256];
    for (int v = 0; v < 256; ++v) table[v] = clamp_truncated(blended(float(v), mean, r, q));
    for (int64_t j = 0; j < n; ++j) dst[j] = table[src[j]];
    return;
  }
  if (kind == 2) {  // with each pixel's grayscale
    for (int k = 0; k < c; ++k) blend_planes(src + k * plane, other.data(), dst + k * plane, plane, r, q);
    return;
  }
  other.resize(size_t(w));  // Sharpness: a row of the smoothed plane, its border the image's
  for (int k = 0; k < c; ++k) {
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = src + k * plane + int64_t(y) * w;
      std::copy(row, row + w, other.begin());
      if (y > 0 && y < h - 1) smoothed_row(row - w, row, row + w, other.data(), w);
      blend_planes(row, other.data(), dst + k * plane + int64_t(y) * w, w, r, q);
    }
  }
}

}  // namespace fastdata
