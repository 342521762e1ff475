// Compiled with -ffp-contract=off (Pillow rounds each product and each sum of these expressions
// on its own, which a fused multiply-add would not) and -fno-trapping-math (no FP exception is
// ever read; it lets the compiler turn the selects into vector blends): CMakeLists.txt. Each
// expression below keeps the order and the types of Pillow's (an int difference of two bytes
// scaled by a double, a double sum left to right), so that the doubles, and so the bytes, are
// the same.
#include "geometry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "clones.h"

namespace fastdata {
namespace {

// Pillow's COORD (-1 below zero, else the integer part) and FLOOR; a value an int cannot hold,
// where Pillow's cast is undefined, is held to the int's range: outside the image either way.
inline int coord(double v) {
  if (v < 0.0) return -1;
  return v < 2147483647.0 ? int(v) : 2147483647;
}

inline int floor_int(double v) {
  if (v < 0.0) {
    if (!(v > -2147483648.0)) return -2147483647 - 1;
    const int t = int(v);  // (toward zero: one above the floor where v is not whole)
    return t - (double(t) > v);
  }
  return v < 2147483647.0 ? int(v) : 2147483647;
}

inline int clip(int v, int size) { return v < 0 ? 0 : (v < size ? v : size - 1); }

struct Image {
  const uint8_t* px;
  int w, h, c;
  const uint8_t* row(int y) const { return px + size_t(y) * size_t(w) * size_t(c); }
  const uint8_t* end() const { return row(h); }
};

inline void copy_pixel(const Image& in, int xin, int yin, uint8_t* out) {
  const uint8_t* p = in.row(yin) + size_t(xin) * size_t(in.c);
  out[0] = p[0];
  if (in.c == 3) {
    out[1] = p[1];
    out[2] = p[2];
  }
}

// Nearest, no rotation or shear: a source column per output column and a row per row, each
// stepped by repeated addition from the first pixel's centre.
void nearest_scaled(const Image& in, uint8_t* out, int ow, int oh, const double* a) {
  std::vector<int> xs(static_cast<size_t>(ow));
  double xo = a[2] + a[0] * 0.5;
  for (int x = 0; x < ow; ++x) {
    xs[size_t(x)] = coord(xo);
    xo += a[0];
  }
  double yo = a[5] + a[4] * 0.5;
  for (int y = 0; y < oh; ++y, yo += a[4]) {
    const int yin = coord(yo);
    if (yin < 0 || yin >= in.h) continue;
    for (int x = 0; x < ow; ++x) {
      const int xin = xs[size_t(x)];
      if (xin >= 0 && xin < in.w) copy_pixel(in, xin, yin, out + (size_t(y) * size_t(ow) + size_t(x)) * size_t(in.c));
    }
  }
}

bool fits_fixed(const double* a, int x, int y) {
  return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

// 16.16 fixed point, rounded as Pillow rounds it. Sums wrap as 32-bit ints (the corners' check
// keeps them in range; unsigned arithmetic keeps a wrap defined).
inline uint32_t fix(double v) { return uint32_t(floor_int(v * 65536.0 + 0.5)); }

void nearest_fixed(const Image& in, uint8_t* out, int ow, int oh, const double* a) {
  const uint32_t a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  uint32_t a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5), a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  for (int y = 0; y < oh; ++y, a2 += a1, a5 += a4) {
    uint32_t xx = a2, yy = a5;
    uint8_t* o = out + size_t(y) * size_t(ow) * size_t(in.c);
    for (int x = 0; x < ow; ++x, xx += a0, yy += a3, o += in.c) {
      const int xin = int32_t(xx) >> 16;  // (an arithmetic shift, as the compilers Pillow is built with do)
      if (xin < 0 || xin >= in.w) continue;
      const int yin = int32_t(yy) >> 16;
      if (yin >= 0 && yin < in.h) copy_pixel(in, xin, yin, o);
    }
  }
}

void nearest_stepped(const Image& in, uint8_t* out, int ow, int oh, const double* a) {
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  for (int y = 0; y < oh; ++y, xo += a[1], yo += a[4]) {
    double xx = xo, yy = yo;
    uint8_t* o = out + size_t(y) * size_t(ow) * size_t(in.c);
    for (int x = 0; x < ow; ++x, xx += a[0], yy += a[3], o += in.c) {
      const int xin = coord(xx);
      if (xin < 0 || xin >= in.w) continue;
      const int yin = coord(yy);
      if (yin >= 0 && yin < in.h) copy_pixel(in, xin, yin, o);
    }
  }
}

// Pillow's cubic through four values at d in [0, 1): on bytes, its p's are int arithmetic (then
// exact in a double); on the rows' doubles, double arithmetic in the same order.
template <class T>
inline double cubic(T v1, T v2, T v3, T v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

constexpr int kStrip = 64;  // (output columns a pass: `by_strips`)

// Each output pixel's centre of a row mapped through the data and split into a whole source
// pixel and a fraction, as the filters' heads do it (in vectors).
FASTDATA_AVX2_CLONE void map_row(const double* __restrict a, int first, double yo, int ow, int w, int h,
                                 double* __restrict dx, double* __restrict dy, int32_t* __restrict xi,
                                 int32_t* __restrict yi, uint8_t* __restrict inside) {
  for (int x = 0; x < ow; ++x) {
    const double xo = (first + x) + 0.5;
    double xin = a[0] * xo + a[1] * yo + a[2];
    double yin = a[3] * xo + a[4] * yo + a[5];
    const bool in = (xin >= 0.0) & (xin < w) & (yin >= 0.0) & (yin < h);
    xin = in ? xin - 0.5 : 0.0;  // (in [-0.5, w - 0.5): its floor is an int; outside, fractions 0)
    yin = in ? yin - 0.5 : 0.0;
    const int32_t tx = int32_t(xin), ty = int32_t(yin);  // toward zero, then down where that was up
    const int32_t fx = tx - int32_t(double(tx) > xin), fy = ty - int32_t(double(ty) > yin);
    dx[x] = xin - fx;
    dy[x] = yin - fy;
    xi[x] = fx;
    yi[x] = fy;
    inside[x] = in;
  }
}

// Which of a filter's two steps a row needs. Where every fraction across the row (dx) is 0,
// Pillow's horizontal step gives each source row's own pixel exactly (a + (b - a) * 0, and the
// cubic's p1 + 0 * (...)), and where every fraction down (dy) is 0 its vertical step gives the
// pixel's own row: then the other step alone runs, on the neighbours it reads (a shear or a
// translation along one axis maps every row so: four of the auto-augments' five maps).
enum class Pass { kBoth, kAcross, kDown };

inline bool all_zero(const double* d, int n) {
  for (int x = 0; x < n; ++x) {
    if (d[x] != 0.0) return false;
  }
  return true;
}

inline int32_t byte_of(uint32_t word, int shift) { return int32_t((word >> shift) & 255u); }

// Bilinear's filter, one channel (the byte at `shift`) of n pixels from their neighbours' words:
// the two horizontal steps and the vertical one; one step of two words for a row of one pass.
FASTDATA_AVX2_CLONE void blend_row(const uint32_t (*__restrict p)[kStrip], const double* __restrict dx,
                                   const double* __restrict dy, int shift, int32_t* __restrict out, int n, Pass pass) {
  if (pass != Pass::kBoth) {
    const double* __restrict d = pass == Pass::kAcross ? dx : dy;
    for (int x = 0; x < n; ++x) {
      const int32_t a = byte_of(p[0][x], shift), b = byte_of(p[1][x], shift);
      out[x] = int32_t(a + (b - a) * d[x]);
    }
    return;
  }
  for (int x = 0; x < n; ++x) {
    const int32_t a = byte_of(p[0][x], shift), b = byte_of(p[1][x], shift);
    const int32_t c = byte_of(p[2][x], shift), d = byte_of(p[3][x], shift);
    const double v1 = a + (b - a) * dx[x];
    const double v2 = c + (d - c) * dx[x];
    out[x] = int32_t(v1 + (v2 - v1) * dy[x]);  // (truncated, as Pillow's cast: the value is in [0, 255])
  }
}

// Four bytes from p as a word, the first in the low bits.
inline uint32_t load_word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

// A pixel's bytes in one word, channel k in bits 8k..8k+7 (a 4-byte load where the buffer goes on).
inline uint32_t word(const uint8_t* p, int channels, const uint8_t* end) {
  if (channels == 1) return p[0];
  if (p + 4 <= end) return load_word(p);
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
}

// A block of RGB pixels, kRows rows of kCols from p (none clipped, the block's last pixel
// followed by another byte of the buffer), into words[kCols * row + col][x].
template <int kRows, int kCols>
inline void block_words(const uint8_t* p, size_t stride, int x, uint32_t (*words)[kStrip]) {
  for (int k = 0; k < kRows; ++k, p += stride) {
    for (int j = 0; j < kCols; ++j) words[kCols * k + j][x] = load_word(p + 3 * j);
  }
}

// Both gathers' fast path: an RGB pixel's kSide x kSide neighbours (across, its row's kSide;
// down, its column's kSide), loaded as words where none is clipped and the block's last pixel
// is followed by another byte of the buffer; false where they are not.
template <int kSide>
inline bool unclipped_words(const Image& in, int xi, int yi, int x, uint32_t (*words)[kStrip], Pass pass) {
  constexpr int back = kSide / 2 - 1;  // (the neighbours before the pixel's own, each way)
  const int top = pass == Pass::kAcross ? yi : yi - back, left = pass == Pass::kDown ? xi : xi - back;
  const bool rows = top >= 0 && top + (pass == Pass::kAcross ? 0 : kSide - 1) < in.h;
  const bool cols = left >= 0 && left + (pass == Pass::kDown ? 1 : kSide) < in.w;
  if (in.c != 3 || !rows || !cols) return false;
  const uint8_t* p = in.row(top) + size_t(left) * 3;
  const size_t stride = size_t(in.w) * 3;
  if (pass == Pass::kBoth) block_words<kSide, kSide>(p, stride, x, words);
  if (pass == Pass::kAcross) block_words<1, kSide>(p, stride, x, words);
  if (pass == Pass::kDown) block_words<kSide, 1>(p, stride, x, words);
  return true;
}

// The filtered maps, a row at a time in passes so that the arithmetic runs in vectors, a strip
// of kStrip output columns at a time, top to bottom (the source pixels a strip reads lie in a
// band a few times its width, which stays in the first-level cache row after row): each output
// pixel's centre mapped (`map_row`); the steps the row needs (`Pass`); its neighbours' words
// gathered (`gather(xi, yi, x, words, pass)`, scalar loads; a pixel outside the source gets the
// fill's word as each, at fractions 0, so that the filter gives the fill); per channel the
// filter on that channel's byte of the words (`filter`); the channels interleaved.
template <int kWords, typename Gather, typename Filter>
void by_strips(const Image& in, uint8_t* out, int ow, int oh, const double* a, const uint8_t* fill, Gather gather,
               Filter filter) {
  constexpr int n = kStrip;
  const int c = in.c;
  double dx[n], dy[n];
  int32_t xi[n], yi[n], v[3][n];
  uint32_t words[kWords][n];
  uint8_t inside[n];
  const uint32_t fills = c == 1 ? fill[0] : uint32_t(fill[0]) | uint32_t(fill[1]) << 8 | uint32_t(fill[2]) << 16;
  for (int first = 0; first < ow; first += kStrip) {
    const int width = std::min(kStrip, ow - first);
    for (int y = 0; y < oh; ++y) {
      map_row(a, first, y + 0.5, width, in.w, in.h, dx, dy, xi, yi, inside);
      const Pass pass = all_zero(dy, width) ? Pass::kAcross : all_zero(dx, width) ? Pass::kDown : Pass::kBoth;
      for (int x = 0; x < width; ++x) {
        if (inside[x]) {
          gather(xi[x], yi[x], x, words, pass);
        } else {
          for (int j = 0; j < kWords; ++j) words[j][x] = fills;
        }
      }
      for (int k = 0; k < c; ++k) filter(words, dx, dy, 8 * k, v[k], width, pass);
      uint8_t* o = out + (size_t(y) * size_t(ow) + size_t(first)) * size_t(c);
      for (int x = 0; x < width; ++x) {
        for (int k = 0; k < c; ++k) o[x * c + k] = uint8_t(v[k][x]);
      }
    }
  }
}

// Bilinear: the four neighbours (a row below the image repeats the pixel's own: Pillow's v2 =
// v1); across, the pixel's row's two; down, its column's two.
void bilinear(const Image& in, uint8_t* out, int ow, int oh, const double* a, const uint8_t* fill) {
  const int c = in.c;
  auto gather = [&](int xi, int yi, int x, uint32_t (*words)[kStrip], Pass pass) {
    if (unclipped_words<2>(in, xi, yi, x, words, pass)) return;
    const int x0 = clip(xi, in.w) * c, x1 = clip(xi + 1, in.w) * c;
    const uint8_t* r0 = in.row(clip(yi, in.h));
    const uint8_t* r1 = yi + 1 >= 0 && yi + 1 < in.h ? in.row(yi + 1) : r0;
    words[0][x] = word(r0 + x0, c, in.end());
    if (pass == Pass::kDown) {
      words[1][x] = word(r1 + x0, c, in.end());
      return;
    }
    words[1][x] = word(r0 + x1, c, in.end());
    if (pass == Pass::kBoth) {
      words[2][x] = word(r1 + x0, c, in.end());
      words[3][x] = word(r1 + x1, c, in.end());
    }
  };
  by_strips<4>(in, out, ow, oh, a, fill, gather, blend_row);
}

// Bicubic: sixteen neighbours, four rows of four (rows and columns clipped to the image, a row
// below it repeating the one before: Pillow's v = v before), Pillow's cubic across each row and
// down the four results, clipped; across, the pixel's row's four; down, its column's four.
FASTDATA_AVX2_CLONE void cubic_row(const uint32_t (*__restrict p)[kStrip], const double* __restrict dx,
                                   const double* __restrict dy, int shift, int32_t* __restrict out, int n, Pass pass) {
  auto clipped = [](double s) { return s <= 0.0 ? 0 : (s >= 255.0 ? 255 : int32_t(s)); };
  if (pass == Pass::kAcross) {
    for (int x = 0; x < n; ++x) {
      out[x] = clipped(cubic<int32_t>(byte_of(p[0][x], shift), byte_of(p[1][x], shift), byte_of(p[2][x], shift),
                                      byte_of(p[3][x], shift), dx[x]));
    }
  } else if (pass == Pass::kDown) {
    for (int x = 0; x < n; ++x) {
      out[x] = clipped(cubic<double>(byte_of(p[0][x], shift), byte_of(p[1][x], shift), byte_of(p[2][x], shift),
                                     byte_of(p[3][x], shift), dy[x]));
    }
  } else {
    for (int x = 0; x < n; ++x) {
      double h[4];
      for (int k = 0; k < 4; ++k) {
        h[k] = cubic<int32_t>(byte_of(p[4 * k][x], shift), byte_of(p[4 * k + 1][x], shift),
                              byte_of(p[4 * k + 2][x], shift), byte_of(p[4 * k + 3][x], shift), dx[x]);
      }
      out[x] = clipped(cubic<double>(h[0], h[1], h[2], h[3], dy[x]));
    }
  }
}

void bicubic(const Image& in, uint8_t* out, int ow, int oh, const double* a, const uint8_t* fill) {
  const int c = in.c;
  auto gather = [&](int xi, int yi, int x, uint32_t (*words)[kStrip], Pass pass) {
    if (unclipped_words<4>(in, xi, yi, x, words, pass)) return;
    const uint8_t* rows4[4] = {in.row(clip(yi - 1, in.h)), nullptr, nullptr, nullptr};
    for (int k = 1; k < 4; ++k) rows4[k] = yi - 1 + k >= 0 && yi - 1 + k < in.h ? in.row(yi - 1 + k) : rows4[k - 1];
    if (pass == Pass::kAcross) {
      for (int j = 0; j < 4; ++j) words[j][x] = word(rows4[1] + clip(xi - 1 + j, in.w) * c, c, in.end());
    } else if (pass == Pass::kDown) {
      for (int k = 0; k < 4; ++k) words[k][x] = word(rows4[k] + clip(xi, in.w) * c, c, in.end());
    } else {
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < 4; ++j) words[4 * k + j][x] = word(rows4[k] + clip(xi - 1 + j, in.w) * c, c, in.end());
      }
    }
  };
  by_strips<16>(in, out, ow, oh, a, fill, gather, cubic_row);
}

}  // namespace

void affine(const uint8_t* src, int w, int h, int channels, uint8_t* out, int ow, int oh, const double data[6],
            int resample, const uint8_t* fill) {
  const size_t n = size_t(ow) * size_t(oh);
  const Image in{src, w, h, channels};
  if (n && w > 0 && h > 0 && resample == 2) {  // (the filtered maps write every pixel, the fill too)
    bilinear(in, out, ow, oh, data, fill);
    return;
  }
  if (n && w > 0 && h > 0 && resample == 3) {
    bicubic(in, out, ow, oh, data, fill);
    return;
  }
  if (n) {  // (nearest: every pixel the fill, then those inside the source written over)
    std::memcpy(out, fill, size_t(channels));
    for (size_t done = 1; done < n; done *= 2) {
      std::memcpy(out + done * size_t(channels), out, std::min(done, n - done) * size_t(channels));
    }
  }
  if (n == 0 || w <= 0 || h <= 0 || resample != 0) return;
  if (data[1] == 0 && data[3] == 0) {
    nearest_scaled(in, out, ow, oh, data);
  } else if (fits_fixed(data, 0, 0) && fits_fixed(data, ow, oh) && fits_fixed(data, 0, oh) &&
             fits_fixed(data, ow, 0)) {
    nearest_fixed(in, out, ow, oh, data);
  } else {
    nearest_stepped(in, out, ow, oh, data);
  }
}

}  // namespace fastdata
