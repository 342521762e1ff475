// Pillow-exact bilinear and bicubic resampling of decoded rows (see resample.h): the filter taps in
// Pillow's fixed point, and the row kernels (generic C++, SSE4.1, AVX2) picked at run time.
#include "resample.h"

#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace fastdata {
namespace {

// Pillow's fixed point for 8-bit resampling: 22 fraction bits leave room for 8 bits of value and
// 2 of overshoot in a signed 32-bit sum. Same bits here, so the same roundings.
constexpr int kPrecisionBits = 32 - 8 - 2;

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's bicubic convolution kernel (a = -0.5), each expression in its order of operations
// (this file is built with -ffp-contract=off: a fused multiply-add would round otherwise).
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

constexpr int kSplitBits = 11;

}  // namespace

void split_weights(Taps* t, int out_size) {
  t->pairs = (t->taps + 1) / 2;
  t->split.assign(size_t(out_size) * t->pairs * 16, 0);
  for (int xx = 0; xx < out_size; ++xx) {
    const int32_t* w = &t->weights[size_t(xx) * t->ksize];
    int16_t* d = &t->split[size_t(xx) * t->pairs * 16];
    for (int x = 0; x < t->taps; ++x) {
      const int j = x / 2, odd = x % 2;
      const int16_t hi = int16_t(w[x] >> kSplitBits);  // arithmetic: exact for negatives too
      const int16_t lo = int16_t(w[x] & ((1 << kSplitBits) - 1));
      for (int c = 0; c < 4; ++c) {
        d[j * 16 + 2 * c + odd] = hi;
        d[j * 16 + 8 + 2 * c + odd] = lo;
      }
    }
  }
}

namespace {

// One output pixel's filter at `center`: its first input pixel (*xmin) and count, and its
// weights in k, normalised to sum to one, as Pillow's precompute_coeffs computes them.
int pixel_weights(int in_size, double center, double support, double ss, bool cubic, int ksize, double* k,
                  int* xmin_out) {
  int xmin = int(center - support + 0.5);  // truncation toward zero, as Pillow's cast
  if (xmin < 0) xmin = 0;
  int xmax = int(center + support + 0.5);
  if (xmax > in_size) xmax = in_size;
  const int n = std::max(0, std::min(xmax - xmin, ksize));
  double ww = 0.0;
  for (int x = 0; x < n; ++x) {
    const double at = (x + xmin - center + 0.5) * ss;
    k[x] = cubic ? bicubic(at) : triangle(at);
    ww += k[x];
  }
  if (ww != 0.0) {
    for (int x = 0; x < n; ++x) k[x] /= ww;
  }
  *xmin_out = xmin;
  return n;
}

// Pillow-SIMD's fraction bits for a pass whose largest weight is `most`: the most, up to 22,
// with which the next would bring that weight to 2^15 (its weights are int16).
int int16_precision(double most) {
  int p = 0;
  for (; p < kPrecisionBits; ++p) {
    if (int(0.5 + most * double(1 << (p + 1))) >= (1 << 15)) break;
  }
  return p;
}

}  // namespace

// The box edges arrive as C floats, as they do in Pillow (its resize parses the box with "f"),
// and their difference is taken in float before widening, so that the scale, every filter
// centre and so every weight come out as Pillow's: a pixel-exact match when the pixels going
// in are the same. The filter support widens with the downscale factor (antialiasing) and stays
// at the kernel's own when enlarging; each output pixel's weights are normalised to sum to one
// before rounding to fixed point (the bicubic's negative lobes round away from zero, as Pillow's).
void compute_taps(int in_size, float in0, float in1, int out_size, Filter filter, Taps* t, int of,
                  int first, bool int16_weights) {
  const bool cubic = filter == Filter::kBicubic;
  const int whole = of > 0 ? of : out_size;
  const double scale = double(in1 - in0) / whole;
  const double filterscale = std::max(scale, 1.0);
  const double support = (cubic ? 2.0 : 1.0) * filterscale;  // the kernel's own support: 1 or 2
  const int ksize = int(std::ceil(support)) * 2 + 1;
  const double ss = 1.0 / filterscale;
  t->ksize = ksize;
  t->start.resize(out_size);
  t->count.resize(out_size);
  t->weights.assign(size_t(out_size) * ksize, 0);
  t->scratch.assign(size_t(out_size + 1) * ksize, 0.0);
  t->lo = in_size;
  t->hi = 0;
  t->taps = 0;
  double most = 0.0;  // the pass's largest weight (Pillow-SIMD's precision)
  for (int xx = 0; xx < out_size; ++xx) {
    double* k = &t->scratch[size_t(xx) * ksize];
    int xmin = 0;
    const int n = pixel_weights(in_size, in0 + (double(first) + xx + 0.5) * scale, support, ss, cubic, ksize, k,
                                &xmin);
    for (int x = 0; x < n; ++x) most = std::max(most, k[x]);
    t->start[xx] = xmin;
    t->count[xx] = n;
    t->taps = std::max(t->taps, n);
    if (n > 0) {
      t->lo = std::min(t->lo, xmin);
      t->hi = std::max(t->hi, xmin + n);
    }
  }
  if (int16_weights && of > 0) {  // the whole resize's pixels outside the window weigh in too
    double* k = &t->scratch[size_t(out_size) * ksize];
    for (int xx = 0; xx < of; ++xx) {
      if (xx == first) xx += out_size;
      if (xx >= of) break;
      int xmin = 0;
      const int n = pixel_weights(in_size, in0 + (xx + 0.5) * scale, support, ss, cubic, ksize, k, &xmin);
      for (int x = 0; x < n; ++x) most = std::max(most, k[x]);
    }
  }
  t->precision = int16_weights ? int16_precision(most) : kPrecisionBits;
  const double unit = double(1 << t->precision);
  for (int xx = 0; xx < out_size; ++xx) {
    const double* k = &t->scratch[size_t(xx) * ksize];
    int32_t* w = &t->weights[size_t(xx) * ksize];
    for (int x = 0; x < t->count[xx]; ++x) {
      const double v = k[x] * unit;
      w[x] = int32_t(v < 0 ? v - 0.5 : v + 0.5);
    }
  }
  if (t->hi <= t->lo) t->lo = t->hi = 0;
}

void window_taps(int in_size, float in0, float in1, int out_size, Resize resize, Taps* t) {
  if (!resize.cut) return compute_taps(in_size, in0, in1, out_size, resize.filter, t, 0, 0, resize.int16_weights);
  const int first = std::max(0, int(std::floor(in0)));
  const int last = std::min(in_size, int(std::ceil(in1)));
  compute_taps(last - first, in0 - float(first), in1 - float(first), out_size, resize.filter, t, 0, 0,
               resize.int16_weights);
  for (int& s : t->start) s += first;
  t->lo += first;
  t->hi += first;
}

namespace {

inline uint8_t clip8(int32_t v, int precision) {
  v >>= precision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The resampling kernels, all giving the same bytes. Pixels are 4 bytes (RGBX, which
// libjpeg-turbo writes at the cost of RGB) so that a pixel's channels fill a 4-lane vector. On
// x86 the CPU picks AVX2 or SSE4.1 versions at run time: with plain C++ the resize, not the
// decode, is the most expensive step of a 224x224 crop.
// Each output pixel sums `taps` taps (the largest count of any), zero weights past its own
// count included (the buffers are padded for it): a fixed trip count that the compiler
// unrolls, instead of a count alternating between 2 and 3 that the branch predictor misses.
// A horizontal kernel resamples two rows per call (ra into da, rb into db; rb may be ra): the
// AVX2 one takes them together, one per 128-bit lane, so that each tap's weights and each
// pixel's bookkeeping serve both.

// Horizontal pass over one decoded row whose first pixel is input column x0: dst[xx] = the
// weighted sum of pixels start[xx] .. start[xx] + taps - 1, in Pillow's fixed point.
template <int K>
void horizontal_generic(const uint8_t* row, int x0, const Taps& t, uint8_t* dst, int out_w) {
  const int taps = K > 0 ? K : t.taps, ksize = t.ksize;
  for (int xx = 0; xx < out_w; ++xx) {
    const uint8_t* p = row + size_t(t.start[xx] - x0) * 4;
    const int32_t* w = &t.weights[size_t(xx) * ksize];
    int32_t s0 = 1 << (t.precision - 1), s1 = s0, s2 = s0;
    for (int x = 0; x < taps; ++x, p += 4) {
      s0 += p[0] * w[x];
      s1 += p[1] * w[x];
      s2 += p[2] * w[x];
    }
    dst[4 * xx + 0] = clip8(s0, t.precision);
    dst[4 * xx + 1] = clip8(s1, t.precision);
    dst[4 * xx + 2] = clip8(s2, t.precision);
    dst[4 * xx + 3] = 0;
  }
}

template <int K>
void horizontal2_generic(const uint8_t* ra, const uint8_t* rb, int x0, const Taps& t,
                         uint8_t* da, uint8_t* db, int out_w) {
  horizontal_generic<K>(ra, x0, t, da, out_w);
  if (rb != ra) horizontal_generic<K>(rb, x0, t, db, out_w);
}

// Vertical pass for one output row: line[j] = clip(sum over k < taps of
// rows[k * row_stride + j] * w[k]) for j < n.
void vertical_generic(const uint8_t* rows, int64_t row_stride, const int32_t* w, int taps, int precision,
                      uint8_t* line, int n) {
  for (int j = 0; j < n; ++j) {
    int32_t s = 1 << (precision - 1);
    for (int k = 0; k < taps; ++k) s += rows[k * row_stride + j] * w[k];
    line[j] = clip8(s, precision);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTDATA_HAVE_SSE41 1

// Two taps per step with pmaddwd, whose 16-bit products cannot hold the 22-bit weights whole:
// each weight is split in two halves that can, and sum = 2^11 * sum(p * hi) + sum(p * lo) is
// exactly Pillow's 32-bit sum. Two adjacent pixels RGBX RGBX are shuffled to the int16 pairs
// (R0 R1 G0 G1 B0 B1 X0 X1), so one pmaddwd gives both taps' products for the 4 channels.
template <int P>
__attribute__((target("sse4.1"))) void horizontal_sse41(const uint8_t* row, int x0,
                                                         const Taps& t, uint8_t* dst,
                                                         int out_w) {
  const int pairs = P > 0 ? P : t.pairs;
  const __m128i half = _mm_set1_epi32(1 << (t.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(t.precision);
  const __m128i to_pairs = _mm_setr_epi8(0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1);
  const __m128i* w = reinterpret_cast<const __m128i*>(t.split.data());
  for (int xx = 0; xx < out_w; ++xx, w += 2 * pairs) {
    const uint8_t* p = row + size_t(t.start[xx] - x0) * 4;
    __m128i hi = _mm_setzero_si128(), lo = _mm_setzero_si128();
    for (int j = 0; j < pairs; ++j, p += 8) {
      const __m128i px =
          _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), to_pairs);
      hi = _mm_add_epi32(hi, _mm_madd_epi16(px, _mm_loadu_si128(w + 2 * j)));
      lo = _mm_add_epi32(lo, _mm_madd_epi16(px, _mm_loadu_si128(w + 2 * j + 1)));
    }
    __m128i acc = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, kSplitBits), lo), half);
    // Shift, then saturate to int16 and to uint8: clip8's clamp to 0..255, four lanes at once.
    acc = _mm_sra_epi32(acc, shift);
    acc = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const int32_t out = _mm_cvtsi128_si32(acc) & 0x00FFFFFF;
    std::memcpy(dst + 4 * xx, &out, 4);
  }
}

template <int P>
__attribute__((target("sse4.1"))) void horizontal2_sse41(const uint8_t* ra, const uint8_t* rb,
                                                          int x0, const Taps& t, uint8_t* da,
                                                          uint8_t* db, int out_w) {
  horizontal_sse41<P>(ra, x0, t, da, out_w);
  if (rb != ra) horizontal_sse41<P>(rb, x0, t, db, out_w);
}

// horizontal_sse41 on two rows at once, row a in the low 128-bit lane and row b in the high one.
template <int P>
__attribute__((target("avx2"))) void horizontal2_avx2(const uint8_t* ra, const uint8_t* rb,
                                                       int x0, const Taps& t, uint8_t* da,
                                                       uint8_t* db, int out_w) {
  const int pairs = P > 0 ? P : t.pairs;
  const __m256i half = _mm256_set1_epi32(1 << (t.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(t.precision);
  const __m256i to_pairs =
      _mm256_setr_epi8(0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1,  //
                       0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1);
  const __m128i* w = reinterpret_cast<const __m128i*>(t.split.data());
  for (int xx = 0; xx < out_w; ++xx, w += 2 * pairs) {
    const size_t off = size_t(t.start[xx] - x0) * 4;
    const uint8_t* pa = ra + off;
    const uint8_t* pb = rb + off;
    __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
    for (int j = 0; j < pairs; ++j, pa += 8, pb += 8) {
      const __m256i px = _mm256_shuffle_epi8(
          _mm256_inserti128_si256(
              _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pa))),
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pb)), 1),
          to_pairs);
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_broadcastsi128_si256(
                                                          _mm_loadu_si128(w + 2 * j))));
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_broadcastsi128_si256(
                                                          _mm_loadu_si128(w + 2 * j + 1))));
    }
    __m256i acc =
        _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, kSplitBits), lo), half);
    acc = _mm256_sra_epi32(acc, shift);
    acc = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);  // per 128-bit lane
    const int32_t a = _mm256_extract_epi32(acc, 0) & 0x00FFFFFF;
    const int32_t b = _mm256_extract_epi32(acc, 4) & 0x00FFFFFF;
    std::memcpy(da + 4 * xx, &a, 4);
    std::memcpy(db + 4 * xx, &b, 4);
  }
}

// 16 values at a time, the accumulators kept in registers across the taps.
__attribute__((target("sse4.1"))) void vertical_sse41(const uint8_t* rows, int64_t row_stride,
                                                      const int32_t* w, int taps, int precision,
                                                      uint8_t* line, int n) {
  const __m128i half = _mm_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    __m128i a0 = half, a1 = half, a2 = half, a3 = half;
    const uint8_t* src = rows + j;
    for (int k = 0; k < taps; ++k, src += row_stride) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i wk = _mm_set1_epi32(w[k]);
      a0 = _mm_add_epi32(a0, _mm_mullo_epi32(_mm_cvtepu8_epi32(v), wk));
      a1 = _mm_add_epi32(a1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4)), wk));
      a2 = _mm_add_epi32(a2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8)), wk));
      a3 = _mm_add_epi32(a3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12)), wk));
    }
    a0 = _mm_sra_epi32(a0, shift);
    a1 = _mm_sra_epi32(a1, shift);
    a2 = _mm_sra_epi32(a2, shift);
    a3 = _mm_sra_epi32(a3, shift);
    const __m128i packed =
        _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(line + j), packed);
  }
  if (j < n) vertical_generic(rows + j, row_stride, w, taps, precision, line + j, n - j);
}

// vertical_sse41 with 32 values at a time.
__attribute__((target("avx2"))) void vertical_avx2(const uint8_t* rows, int64_t row_stride,
                                                   const int32_t* w, int taps, int precision,
                                                   uint8_t* line, int n) {
  const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  // packs/packus work within 128-bit lanes; this puts the 4-byte groups back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256i a0 = half, a1 = half, a2 = half, a3 = half;
    const uint8_t* src = rows + j;
    for (int k = 0; k < taps; ++k, src += row_stride) {
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      const __m256i wk = _mm256_set1_epi32(w[k]);
      a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v0), wk));
      a1 = _mm256_add_epi32(
          a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v0, 8)), wk));
      a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v1), wk));
      a3 = _mm256_add_epi32(
          a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v1, 8)), wk));
    }
    a0 = _mm256_sra_epi32(a0, shift);
    a1 = _mm256_sra_epi32(a1, shift);
    a2 = _mm256_sra_epi32(a2, shift);
    a3 = _mm256_sra_epi32(a3, shift);
    const __m256i packed =
        _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(line + j),
                        _mm256_permutevar8x32_epi32(packed, order));
  }
  if (j < n) vertical_sse41(rows + j, row_stride, w, taps, precision, line + j, n - j);
}
#endif

struct Cpu {
  bool sse41 = false, avx2 = false;
};

// Asked once, on first use: not in a static initialiser, which may run before libgcc has read
// the CPU's features. FASTDATA_DECODE_SIMD=sse4.1 or =none caps what is used, so that the tests
// can check every kernel against the others on one machine.
const Cpu& cpu() {
  static const Cpu features = [] {
    Cpu f;
#if FASTDATA_HAVE_SSE41
    __builtin_cpu_init();
    f.sse41 = __builtin_cpu_supports("sse4.1");
    f.avx2 = __builtin_cpu_supports("avx2");  // checks that the OS saves the YMM registers too
    if (const char* cap = std::getenv("FASTDATA_DECODE_SIMD")) {
      if (std::strcmp(cap, "sse4.1") == 0) f.avx2 = false;
      if (std::strcmp(cap, "none") == 0) f.sse41 = f.avx2 = false;
    }
#endif
    return f;
  }();
  return features;
}

}  // namespace

// The SIMD horizontal kernels read the split weights (split_weights), the generic ones not.
bool horizontal_needs_split() { return cpu().sse41 || cpu().avx2; }

HorizontalKernel pick_horizontal(int taps) {
#if FASTDATA_HAVE_SSE41
  if (cpu().avx2) {
    switch ((taps + 1) / 2) {
      case 1: return horizontal2_avx2<1>;
      case 2: return horizontal2_avx2<2>;
      case 3: return horizontal2_avx2<3>;
      default: return horizontal2_avx2<0>;
    }
  }
  if (cpu().sse41) {
    switch ((taps + 1) / 2) {
      case 1: return horizontal2_sse41<1>;
      case 2: return horizontal2_sse41<2>;
      case 3: return horizontal2_sse41<3>;
      default: return horizontal2_sse41<0>;
    }
  }
#endif
  switch (taps) {
    case 2: return horizontal2_generic<2>;
    case 3: return horizontal2_generic<3>;
    case 4: return horizontal2_generic<4>;
    default: return horizontal2_generic<0>;
  }
}

VerticalKernel pick_vertical() {
#if FASTDATA_HAVE_SSE41
  if (cpu().avx2) return vertical_avx2;
  if (cpu().sse41) return vertical_sse41;
#endif
  return vertical_generic;
}

namespace {

#if FASTDATA_HAVE_SSE41
// The planar case of write_line, 16 pixels at a time: each 4-pixel load is shuffled to its
// 4 R, 4 G, 4 B, 4 X bytes, and a 4x4 transpose of 32-bit words gathers 16 bytes per channel.
// Mirrored blocks are byte-reversed and stored at the mirrored place.
__attribute__((target("sse4.1"))) int write_planar_sse41(const uint8_t* line, int out_w,
                                                          uint8_t* d0, uint8_t* d1, uint8_t* d2,
                                                          bool flip) {
  const __m128i by_channel = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m128i reverse = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  int xx = 0;
  for (; xx + 16 <= out_w; xx += 16) {
    const __m128i* src = reinterpret_cast<const __m128i*>(line + 4 * xx);
    const __m128i q0 = _mm_shuffle_epi8(_mm_loadu_si128(src), by_channel);
    const __m128i q1 = _mm_shuffle_epi8(_mm_loadu_si128(src + 1), by_channel);
    const __m128i q2 = _mm_shuffle_epi8(_mm_loadu_si128(src + 2), by_channel);
    const __m128i q3 = _mm_shuffle_epi8(_mm_loadu_si128(src + 3), by_channel);
    const __m128i t0 = _mm_unpacklo_epi32(q0, q1), t1 = _mm_unpackhi_epi32(q0, q1);
    const __m128i t2 = _mm_unpacklo_epi32(q2, q3), t3 = _mm_unpackhi_epi32(q2, q3);
    __m128i r = _mm_unpacklo_epi64(t0, t2), g = _mm_unpackhi_epi64(t0, t2);
    __m128i b = _mm_unpacklo_epi64(t1, t3);
    int at = xx;
    if (flip) {
      r = _mm_shuffle_epi8(r, reverse);
      g = _mm_shuffle_epi8(g, reverse);
      b = _mm_shuffle_epi8(b, reverse);
      at = out_w - 16 - xx;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d0 + at), r);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d1 + at), g);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d2 + at), b);
  }
  return xx;
}

// The interleaved case (channels_last: sc 1, sx 3), 16 pixels at a time: each 4-pixel load
// is shuffled to its 12 RGB bytes (in reverse pixel order when mirrored), and the four are
// shifted together into three whole 16-byte stores, so nothing is written past the row.
__attribute__((target("sse4.1"))) int write_rgb_sse41(const uint8_t* line, int out_w,
                                                       uint8_t* dst, bool flip) {
  const __m128i rgb = flip ? _mm_setr_epi8(12, 13, 14, 8, 9, 10, 4, 5, 6, 0, 1, 2, -1, -1, -1, -1)
                           : _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  int xx = 0;
  for (; xx + 16 <= out_w; xx += 16) {
    const __m128i* src = reinterpret_cast<const __m128i*>(line + 4 * xx);
    __m128i q0 = _mm_shuffle_epi8(_mm_loadu_si128(src), rgb);
    __m128i q1 = _mm_shuffle_epi8(_mm_loadu_si128(src + 1), rgb);
    __m128i q2 = _mm_shuffle_epi8(_mm_loadu_si128(src + 2), rgb);
    __m128i q3 = _mm_shuffle_epi8(_mm_loadu_si128(src + 3), rgb);
    uint8_t* d = dst + 3 * int64_t(xx);
    if (flip) {  // the 16 pixels land at the mirrored place, last first
      std::swap(q0, q3);
      std::swap(q1, q2);
      d = dst + 3 * int64_t(out_w - 16 - xx);
    }
    __m128i* o = reinterpret_cast<__m128i*>(d);
    _mm_storeu_si128(o, _mm_or_si128(q0, _mm_slli_si128(q1, 12)));
    _mm_storeu_si128(o + 1, _mm_or_si128(_mm_srli_si128(q1, 4), _mm_slli_si128(q2, 8)));
    _mm_storeu_si128(o + 2, _mm_or_si128(_mm_srli_si128(q2, 8), _mm_slli_si128(q3, 4)));
  }
  return xx;
}
#endif

}  // namespace

// Writes one resampled RGBX line to an output row: channel c of pixel xx at
// c * sc + xx * sx bytes, pixels in reverse order when flip.
void write_line(const uint8_t* line, int out_w, uint8_t* dst, int64_t sc, int64_t sx, bool flip) {
  int xx = 0;
  if (sx == 1) {  // planar (NCHW): one channel at a time, sequential writes
    uint8_t *d0 = dst, *d1 = dst + sc, *d2 = dst + 2 * sc;
#if FASTDATA_HAVE_SSE41
    if (cpu().sse41) xx = write_planar_sse41(line, out_w, d0, d1, d2, flip);
#endif
    for (; xx < out_w; ++xx) {
      const int at = flip ? out_w - 1 - xx : xx;
      d0[at] = line[4 * xx];
      d1[at] = line[4 * xx + 1];
      d2[at] = line[4 * xx + 2];
    }
    return;
  }
#if FASTDATA_HAVE_SSE41
  if (sc == 1 && sx == 3 && cpu().sse41) xx = write_rgb_sse41(line, out_w, dst, flip);
#endif
  if (flip) {
    dst += int64_t(out_w - 1 - xx) * sx;
    sx = -sx;
  } else {
    dst += int64_t(xx) * sx;
  }
  for (; xx < out_w; ++xx, dst += sx) {
    dst[0] = line[4 * xx];
    dst[sc] = line[4 * xx + 1];
    dst[2 * sc] = line[4 * xx + 2];
  }
}

namespace {

// Image i's pixels x0 .. x0 + cols - 1 of row y as RGBX (an L pixel's value in R, G and B) into dst.
void load_rgbx(const uint8_t* row, int c, int x0, int cols, uint8_t* dst) {
  const uint8_t* p = row + int64_t(x0) * c;
  if (c == 3) {
    for (int x = 0; x < cols; ++x, p += 3, dst += 4) {
      dst[0] = p[0];
      dst[1] = p[1];
      dst[2] = p[2];
      dst[3] = 0;
    }
  } else {
    for (int x = 0; x < cols; ++x, ++p, dst += 4) {
      dst[0] = dst[1] = dst[2] = *p;
      dst[3] = 0;
    }
  }
}

// One resampled RGBX line into an output row of c channels.
void store_line(const uint8_t* line, int ow, int c, uint8_t* dst) {
  if (c == 3) return write_line(line, ow, dst, 1, 3, false);
  for (int xx = 0; xx < ow; ++xx) dst[xx] = line[4 * xx];
}

// decode.cpp's passes over decoded rows, here over an image's rows: horizontal then vertical (each
// input row the vertical taps reach resampled across, then each output row summed down), or with
// `vertical_first` each output row summed down the input rows, then resampled across.
void resize_one(const uint8_t* src, int h, int w, int c, const int64_t* box, uint8_t* out, int oh, int ow,
                Resize r, bool vertical_first) {
  Taps ht, vt;
  window_taps(w, float(box[0]), float(box[2]), ow, r, &ht);
  window_taps(h, float(box[1]), float(box[3]), oh, r, &vt);
  if (horizontal_needs_split()) split_weights(&ht, ow);
  const HorizontalKernel horizontal = pick_horizontal(ht.taps);
  const VerticalKernel vertical = pick_vertical();
  const int x0 = ht.lo, cols = ht.hi - ht.lo, rows = vt.hi - vt.lo, n = ow * 4;
  const int64_t in_row = int64_t(w) * c, out_row = int64_t(ow) * c;
  // each loaded row padded as the horizontal kernels read: `taps` taps (rounded up to even) from every start
  const size_t row_bytes = size_t(cols + ht.taps + 1) * 4;
  std::vector<uint8_t> row(2 * row_bytes, 0), line(2 * size_t(n));
  if (vertical_first) {
    std::vector<uint8_t> loaded(size_t(rows) * row_bytes, 0);
    for (int y = 0; y < rows; ++y) load_rgbx(src + (vt.lo + y) * in_row, c, x0, cols, &loaded[y * row_bytes]);
    for (int yy = 0; yy < oh; yy += 2) {
      const int want = std::min(2, oh - yy);
      for (int k = 0; k < want; ++k) {
        vertical(&loaded[size_t(vt.start[yy + k] - vt.lo) * row_bytes], int64_t(row_bytes),
                 &vt.weights[size_t(yy + k) * vt.ksize], vt.count[yy + k], vt.precision, &row[k * row_bytes],
                 cols * 4);
      }
      const uint8_t* second = want == 2 ? &row[row_bytes] : row.data();
      horizontal(row.data(), second, x0, ht, line.data(), want == 2 ? &line[n] : line.data(), ow);
      for (int k = 0; k < want; ++k) store_line(&line[k * n], ow, c, out + (yy + k) * out_row);
    }
    return;
  }
  std::vector<uint8_t> across(size_t(rows) * n);
  for (int y = 0; y < rows; y += 2) {
    const int want = std::min(2, rows - y);
    for (int k = 0; k < want; ++k) load_rgbx(src + (vt.lo + y + k) * in_row, c, x0, cols, &row[k * row_bytes]);
    uint8_t* d = &across[size_t(y) * n];
    horizontal(row.data(), want == 2 ? &row[row_bytes] : row.data(), x0, ht, d, want == 2 ? d + n : d, ow);
  }
  for (int yy = 0; yy < oh; ++yy) {
    vertical(&across[size_t(vt.start[yy] - vt.lo) * n], n, &vt.weights[size_t(yy) * vt.ksize], vt.count[yy],
             vt.precision, line.data(), n);
    store_line(line.data(), ow, c, out + yy * out_row);
  }
}

}  // namespace

void resize_images(const uint8_t* src, int64_t n, int h, int w, int c, const int64_t* boxes, uint8_t* out,
                   int oh, int ow, Resize resize, const uint8_t* vertical_first, int threads) {
  resize.cut = true;
  const int64_t in_image = int64_t(h) * w * c, out_image = int64_t(oh) * ow * c;
  std::atomic<bool> short_of_memory{false};
  parallel_for(n, threads, [&](int64_t i) {
    try {
      resize_one(src + i * in_image, h, w, c, boxes + 4 * i, out + i * out_image, oh, ow, resize,
                 vertical_first != nullptr && vertical_first[i] != 0);
    } catch (const std::bad_alloc&) {  // (its taps' and rows' buffers)
      short_of_memory = true;
    }
  });
  if (short_of_memory) throw std::bad_alloc();
}

}  // namespace fastdata
