#include "decode.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t without including them
#include <cstdlib>
#include <cstring>
#include <new>

#include <jpeglib.h>

#include "entropy.h"
#include "parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace fastdata {
namespace {

// Refusing larger images keeps a hostile header from making libjpeg allocate gigabytes (a
// progressive JPEG buffers every coefficient of the image before the first row). The loaders
// refuse them before any decode (fastdata._codec.MAX_IMAGE_PIXELS); kMaxImagePixels (decode.h)
// is the same limit for direct callers.

// Pillow's fixed point for 8-bit resampling: 22 fraction bits leave room for 8 bits of value and
// 2 of overshoot in a signed 32-bit sum. Same bits here, so the same roundings.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands &pub around as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 96];
};

// libjpeg's default error_exit prints and calls exit(); this one keeps the message and jumps
// back to the setjmp in Decoder, which aborts the decompression and reports it.
[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->pub.format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Strict: a warning is an error. libjpeg warns and carries on for truncated or corrupt data
// (JWRN_JPEG_EOF "Premature end of JPEG file", JWRN_HIT_MARKER, ...), padding the image with
// gray; a training sample should be the image or an error the loader can act on, never a guess.
// Trace messages (level >= 0) are dropped, so nothing is ever printed.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// One axis of Pillow's separable resampling (BILINEAR): for output pixel i, input pixels
// start[i] .. start[i] + count[i] - 1 weighted by weights[i * ksize ...] in fixed point.
struct Taps {
  int ksize = 0;
  std::vector<int> start, count;
  std::vector<int32_t> weights;
  std::vector<double> scratch;
  int lo = 0, hi = 0;  // the input pixels used at all: [lo, hi)
  int taps = 0;        // the largest count: every output pixel sums that many taps
  // For the SIMD horizontal kernels: each weight split as w = hi * 2^11 + lo (both fit int16);
  // per output pixel and pair of taps j, two vectors of 8 int16, (hi[2j], hi[2j + 1]) and
  // (lo[2j], lo[2j + 1]), each repeated for the 4 channels.
  int pairs = 0;
  std::vector<int16_t> split;
};

constexpr int kSplitBits = 11;

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

// The box edges arrive as C floats, as they do in Pillow (its resize parses the box with "f"),
// and their difference is taken in float before widening, so that the scale, every filter
// centre and so every weight come out as Pillow's: a pixel-exact match when the pixels going
// in are the same. The filter support widens with the downscale factor (antialiasing) and stays
// at one pixel when enlarging; each output pixel's weights are normalised to sum to one before
// rounding to fixed point.
void compute_taps(int in_size, float in0, float in1, int out_size, Taps* t) {
  const double scale = double(in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle's support is 1
  const int ksize = int(std::ceil(support)) * 2 + 1;
  t->ksize = ksize;
  t->start.resize(out_size);
  t->count.resize(out_size);
  t->weights.assign(size_t(out_size) * ksize, 0);
  t->scratch.resize(ksize);
  double* k = t->scratch.data();
  const double ss = 1.0 / filterscale;
  t->lo = in_size;
  t->hi = 0;
  t->taps = 0;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    int xmin = int(center - support + 0.5);  // truncation toward zero, as Pillow's cast
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    const int n = std::max(0, std::min(xmax - xmin, ksize));
    double ww = 0.0;
    for (int x = 0; x < n; ++x) {
      k[x] = triangle((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    int32_t* w = &t->weights[size_t(xx) * ksize];
    for (int x = 0; x < n; ++x) {
      const double v = (ww != 0.0 ? k[x] / ww : k[x]) * (1 << kPrecisionBits);
      w[x] = int32_t(v < 0 ? v - 0.5 : v + 0.5);
    }
    t->start[xx] = xmin;
    t->count[xx] = n;
    t->taps = std::max(t->taps, n);
    if (n > 0) {
      t->lo = std::min(t->lo, xmin);
      t->hi = std::max(t->hi, xmin + n);
    }
  }
  if (t->hi <= t->lo) t->lo = t->hi = 0;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
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
using HorizontalKernel = void (*)(const uint8_t* ra, const uint8_t* rb, int x0, const Taps&,
                                  uint8_t* da, uint8_t* db, int out_w);
using VerticalKernel = void (*)(const uint8_t*, int64_t, const int32_t*, int, uint8_t*, int);

// Horizontal pass over one decoded row whose first pixel is input column x0: dst[xx] = the
// weighted sum of pixels start[xx] .. start[xx] + taps - 1, in Pillow's fixed point.
template <int K>
void horizontal_generic(const uint8_t* row, int x0, const Taps& t, uint8_t* dst, int out_w) {
  const int taps = K > 0 ? K : t.taps, ksize = t.ksize;
  for (int xx = 0; xx < out_w; ++xx) {
    const uint8_t* p = row + size_t(t.start[xx] - x0) * 4;
    const int32_t* w = &t.weights[size_t(xx) * ksize];
    int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
    for (int x = 0; x < taps; ++x, p += 4) {
      s0 += p[0] * w[x];
      s1 += p[1] * w[x];
      s2 += p[2] * w[x];
    }
    dst[4 * xx + 0] = clip8(s0);
    dst[4 * xx + 1] = clip8(s1);
    dst[4 * xx + 2] = clip8(s2);
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
void vertical_generic(const uint8_t* rows, int64_t row_stride, const int32_t* w, int taps,
                      uint8_t* line, int n) {
  for (int j = 0; j < n; ++j) {
    int32_t s = 1 << (kPrecisionBits - 1);
    for (int k = 0; k < taps; ++k) s += rows[k * row_stride + j] * w[k];
    line[j] = clip8(s);
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
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
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
    acc = _mm_srai_epi32(acc, kPrecisionBits);
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
  const __m256i half = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
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
    acc = _mm256_srai_epi32(acc, kPrecisionBits);
    acc = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);  // per 128-bit lane
    const int32_t a = _mm256_extract_epi32(acc, 0) & 0x00FFFFFF;
    const int32_t b = _mm256_extract_epi32(acc, 4) & 0x00FFFFFF;
    std::memcpy(da + 4 * xx, &a, 4);
    std::memcpy(db + 4 * xx, &b, 4);
  }
}

// 16 values at a time, the accumulators kept in registers across the taps.
__attribute__((target("sse4.1"))) void vertical_sse41(const uint8_t* rows, int64_t row_stride,
                                                      const int32_t* w, int taps, uint8_t* line,
                                                      int n) {
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
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
    a0 = _mm_srai_epi32(a0, kPrecisionBits);
    a1 = _mm_srai_epi32(a1, kPrecisionBits);
    a2 = _mm_srai_epi32(a2, kPrecisionBits);
    a3 = _mm_srai_epi32(a3, kPrecisionBits);
    const __m128i packed =
        _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(line + j), packed);
  }
  if (j < n) vertical_generic(rows + j, row_stride, w, taps, line + j, n - j);
}

// vertical_sse41 with 32 values at a time.
__attribute__((target("avx2"))) void vertical_avx2(const uint8_t* rows, int64_t row_stride,
                                                   const int32_t* w, int taps, uint8_t* line,
                                                   int n) {
  const __m256i half = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
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
    a0 = _mm256_srai_epi32(a0, kPrecisionBits);
    a1 = _mm256_srai_epi32(a1, kPrecisionBits);
    a2 = _mm256_srai_epi32(a2, kPrecisionBits);
    a3 = _mm256_srai_epi32(a3, kPrecisionBits);
    const __m256i packed =
        _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(line + j),
                        _mm256_permutevar8x32_epi32(packed, order));
  }
  if (j < n) vertical_sse41(rows + j, row_stride, w, taps, line + j, n - j);
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
#endif

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
  if (flip) {
    dst += int64_t(out_w - 1) * sx;
    sx = -sx;
  }
  for (; xx < out_w; ++xx, dst += sx) {
    dst[0] = line[4 * xx];
    dst[sc] = line[4 * xx + 1];
    dst[2 * sc] = line[4 * xx + 2];
  }
}

// Checks libjpeg would make anyway, with clearer messages and no decompressor touched.
std::string precheck(const ByteSpan& src) {
  if (src.size == 0) return "empty input: 0 bytes";
  if (src.size < 2) return format("not a JPEG file: 1 byte (0x%02x)", src.data[0]);
  if (src.data[0] != 0xFF || src.data[1] != 0xD8) {
    return format("not a JPEG file: starts with 0x%02x 0x%02x", src.data[0], src.data[1]);
  }
  return {};
}

// A thread's decoder: its row buffers and filter taps are reused from image to image, its libjpeg
// decompressor is made anew for each (see fresh()).
class Decoder {
 public:
  Decoder() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = on_error;
    err_.pub.emit_message = on_message;
    if (setjmp(err_.jump) == 0) {
      jpeg_create_decompress(&cinfo_);
      created_ = true;
    }
  }
  ~Decoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  std::string info(const ByteSpan& src, JpegInfo* out) {
    std::string why = precheck(src);
    if (!why.empty()) return why;
    if (!fresh()) return "out of memory";
    if (!read_info(src, out)) return err_.message;
    return {};
  }

  std::string decode(const ByteSpan& caller, const int32_t* crop, bool flip, bool whole,
                     bool use_index, const OutView& out, int64_t index) {
    // Everything below reads a private copy: the caller's buffer may be a bytearray, numpy
    // array or mmap that another thread rewrites while the GIL is released, and the walk,
    // libjpeg and the checkpoints' hash must all see the same bytes.
    copy_.assign(caller.data, caller.data + caller.size);
    const ByteSpan src{copy_.data(), copy_.size()};
    std::string why = decode_copy(src, crop, flip, whole, use_index, out, index);
    trim();
    return why;
  }

  // The bytes this thread's decoder keeps between decodes.
  size_t scratch_bytes() const {
    return copy_.capacity() + row_.capacity() + rows_.capacity() + line_.capacity() +
           entropy_.scratch_bytes();
  }

 private:
  // A buffer over this many bytes is freed after the decode that grew it: one oversized file
  // does not hold its copy for the thread's life (a typical photo's buffers stay and are reused).
  static constexpr size_t kScratchKeep = size_t(4) << 20;

  void trim() {
    for (std::vector<uint8_t>* b : {&copy_, &row_, &rows_, &line_}) {
      if (b->capacity() > kScratchKeep) std::vector<uint8_t>().swap(*b);
    }
    entropy_.trim(kScratchKeep);
  }

  std::string decode_copy(const ByteSpan& src, const int32_t* crop, bool flip, bool whole,
                          bool use_index, const OutView& out, int64_t index) {
    std::string why = precheck(src);
    if (why.empty()) {
      // A decode reads only the rows the crop needs; the walk makes a file cut short an error
      // whatever the crop.
      ImageStructure structure;
      why = check_structure(src, &structure);
    }
    if (!why.empty()) return why;
    if (!fresh()) return "out of memory";
    try {
      if (!decode_window(src, crop, out.height, out.width, whole, use_index)) return err_.message;
    } catch (const std::bad_alloc&) {
      entropy_.detach(false);
      jpeg_abort_decompress(&cinfo_);  // safe in any state; readies cinfo_ for the next image
      return "out of memory";
    }
    resample_columns(out, index, flip);
    return {};
  }

  // A decompressor keeps the quantization and Huffman tables of the images it read (libjpeg's
  // support for abbreviated datastreams, which leave them out), so a JPEG missing a table would
  // decode with an earlier image's instead of failing as in Pillow, and the same bytes would
  // decode or not depending on what the thread read before. So every image gets a new one
  // (a few small allocations, next to a decode's); false when it cannot be made.
  bool fresh() {
    if (created_ && used_) {
      jpeg_destroy_decompress(&cinfo_);
      created_ = false;
    }
    if (!created_) {
      if (setjmp(err_.jump) == 0) {
        jpeg_create_decompress(&cinfo_);  // keeps cinfo_.err
        created_ = true;
      }
    }
    used_ = created_;
    return created_;
  }

  // Everything between a setjmp and the libjpeg calls that may longjmp to it keeps its state
  // in members, never in locals with destructors: longjmp skips destructors.
  bool read_info(const ByteSpan& src, JpegInfo* out) {
    if (setjmp(err_.jump)) {
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    jpeg_mem_src(&cinfo_, src.data, static_cast<unsigned long>(src.size));
    jpeg_read_header(&cinfo_, TRUE);
    out->width = int(cinfo_.image_width);
    out->height = int(cinfo_.image_height);
    out->components = cinfo_.num_components;
    jpeg_abort_decompress(&cinfo_);
    return true;
  }

  bool fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err_.message, sizeof err_.message, fmt, ap);
    va_end(ap);
    entropy_.detach(false);
    jpeg_abort_decompress(&cinfo_);
    return false;
  }

  // Decodes the rows and columns of the crop window that the resampling reads, and runs the
  // horizontal pass on each row as it arrives, into rows_ (one row of out_w RGBX pixels per
  // input row used): the decoded window itself is never held whole. With `whole`, the rows
  // below the window are entropy-decoded as well (see below).
  bool decode_window(const ByteSpan& src, const int32_t* crop, int out_h, int out_w, bool whole,
                     bool use_index) {
    if (setjmp(err_.jump)) {
      entropy_.detach(false);
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    jpeg_mem_src(&cinfo_, src.data, static_cast<unsigned long>(src.size));
    jpeg_read_header(&cinfo_, TRUE);
    switch (cinfo_.jpeg_color_space) {
      case JCS_GRAYSCALE:
      case JCS_YCbCr:
      case JCS_RGB: break;
      // libjpeg has no CMYK -> RGB conversion; the caller's Pillow fallback has one.
      case JCS_CMYK: return fail("unsupported JPEG color space CMYK");
      case JCS_YCCK: return fail("unsupported JPEG color space YCCK");
      default:
        return fail("unsupported JPEG color space (%d components)", cinfo_.num_components);
    }
    const int64_t W = cinfo_.image_width, H = cinfo_.image_height;
    if (uint64_t(W) * uint64_t(H) > kMaxImagePixels) {
      return fail("image of %lldx%lld pixels is over the limit of %llu pixels", (long long)W,
                  (long long)H, (unsigned long long)kMaxImagePixels);
    }
    const int64_t x = crop[0], y = crop[1], w = crop[2], h = crop[3];
    if (w <= 0 || h <= 0 || x < 0 || y < 0 || x + w > W || y + h > H) {
      return fail("crop (%lld, %lld, %lld, %lld) outside the %lldx%lld image", (long long)x,
                  (long long)y, (long long)w, (long long)h, (long long)W, (long long)H);
    }
    // DCT scaling: the IDCT itself shrinks by 2, 4 or 8, the cheapest way to drop pixels the
    // resize would average away anyway. Taken only while the scaled window still has at least
    // the output's pixels, so the resize never enlarges what it was handed.
    int denom = 1;
    for (int d : {8, 4, 2}) {
      if (w >= int64_t(out_w) * d && h >= int64_t(out_h) * d) {
        denom = d;
        break;
      }
    }
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = unsigned(denom);
    // RGB with a pad byte (see the kernels); grayscale comes out as R = G = B.
    cinfo_.out_color_space = JCS_EXT_RGBX;
    cinfo_.dct_method = JDCT_ISLOW;    // Pillow's (libjpeg's default): the same pixels as there
    cinfo_.do_fancy_upsampling = TRUE;
    jpeg_calc_output_dimensions(&cinfo_);
    const int sw = int(cinfo_.output_width), sh = int(cinfo_.output_height);

    // The box in the scaled image's pixels: a scaled pixel j covers original pixels
    // [j * denom, (j + 1) * denom), so the box just divides (exactly: denom is a power of 2).
    const float s = 1.0f / float(denom);
    compute_taps(sw, float(x) * s, float(x + w) * s, out_w, &htaps_);
    compute_taps(sh, float(y) * s, float(y + h) * s, out_h, &vtaps_);

    jpeg_start_decompress(&cinfo_);
    // One column more on each side than the taps read: fancy (smooth) chroma upsampling at the
    // edge of a cropped window sees no neighbour beyond it and replicates the edge instead, so
    // the window's outermost columns differ from a full decode's (about 1 crop in 5 without
    // the margin). jpeg_crop_scanline then widens the window to iMCU boundaries and
    // says where it starts. Only for luma MCUs of up to 4 blocks (4:4:4, 4:2:2, 4:4:0, 4:2:0,
    // 4:1:1): libjpeg-turbo 2.1.5 crops 4x2 and 2x4 MCUs wrongly at 1/2 and 1/4 scale (found by
    // comparing with full decodes); the rare larger MCUs decode full width.
    JDIMENSION xoff = JDIMENSION(std::max(0, htaps_.lo - 1));
    JDIMENSION cw = JDIMENSION(std::min(sw, htaps_.hi + 1)) - xoff;
    const bool crop_ok = cinfo_.max_h_samp_factor * cinfo_.max_v_samp_factor <= 4;
    if (!crop_ok) {
      xoff = 0;
      cw = JDIMENSION(sw);
    }
    if (cw < JDIMENSION(sw)) jpeg_crop_scanline(&cinfo_, &xoff, &cw);
    const bool indexed = use_index && entropy_.attach(&cinfo_, src);
    x0_ = int(xoff);
    y0_ = vtaps_.lo;
    const int rows = vtaps_.hi - vtaps_.lo;
    // Two rows at a time, each padded: the horizontal kernels read `taps` taps (rounded up to
    // even) from every start.
    const size_t row_bytes = size_t(cw + htaps_.taps + 1) * 4;
    row_.assign(2 * row_bytes, 0);
    rows_.resize(size_t(rows) * out_w * 4);
    const HorizontalKernel horizontal = pick_horizontal(htaps_.taps);
    if (horizontal_needs_split()) split_weights(&htaps_, out_w);
    if (y0_ > 0 && jpeg_skip_scanlines(&cinfo_, JDIMENSION(y0_)) != JDIMENSION(y0_)) {
      return fail("Premature end of JPEG file (could not skip to row %d)", y0_);
    }
    for (int r = 0; r < rows; r += 2) {
      const int want = std::min(2, rows - r);
      JSAMPROW p[2] = {row_.data(), row_.data() + row_bytes};
      for (int got = 0; got < want;) {
        const JDIMENSION n = jpeg_read_scanlines(&cinfo_, p + got, JDIMENSION(want - got));
        if (n == 0) return fail("Premature end of JPEG file (row %d of %d)", y0_ + r + got, sh);
        got += int(n);
      }
      uint8_t* d = rows_.data() + size_t(r) * out_w * 4;
      horizontal(p[0], want == 2 ? p[1] : p[0], x0_, htaps_, d, want == 2 ? d + out_w * 4 : d,
                 out_w);
    }
    // With `whole`, the rows below the window are entropy-decoded too (Huffman decoding only, no
    // IDCT, upsampling or colour conversion), so that corrupt data there (a file cut short and
    // closed with an end marker, a bad Huffman code) is an error for every crop, not only for
    // the crops that reach it. Once a file has decoded whole without error, the caller may drop
    // `whole` for it: its later decodes stop at the window's last row; and the entropy decoder
    // drops it for bytes its index has (proven whole), and adds it for bytes it would index
    // (learning: a file's first decode on the machine). Without the entropy decoder, libjpeg's
    // skip: its skip to the very end returns without decoding, so the skip stops a row short
    // and the last row is read. A multi-scan (progressive) image was read whole by
    // jpeg_start_decompress already, with or without `whole`.
    if (indexed) {
      if ((whole || entropy_.learning()) && !entropy_.proven_whole()) entropy_.decode_rest(&cinfo_);
    } else if (whole && !jpeg_has_multiple_scans(&cinfo_)) {
      const JDIMENSION left = cinfo_.output_height - cinfo_.output_scanline;
      if (left > 1 && jpeg_skip_scanlines(&cinfo_, left - 1) != left - 1) {
        return fail("Premature end of JPEG file (below the crop window)");
      }
      JSAMPROW p = row_.data();
      if (left > 0 && jpeg_read_scanlines(&cinfo_, &p, 1) != 1) {
        return fail("Premature end of JPEG file (last row)");
      }
    }
    entropy_.detach(true);
    // Stop here, before the end-of-image bookkeeping of jpeg_finish_decompress.
    jpeg_abort_decompress(&cinfo_);
    return true;
  }

  // Vertical pass from rows_ into out[index], mirrored while written when `flip`.
  void resample_columns(const OutView& out, int64_t index, bool flip) {
    const int n = out.width * 4, ksize = vtaps_.ksize;
    const VerticalKernel vertical = pick_vertical();
    line_.resize(size_t(n));
    uint8_t* base = out.data + index * out.batch_stride;
    for (int yy = 0; yy < out.height; ++yy) {
      vertical(rows_.data() + size_t(vtaps_.start[yy] - y0_) * n, n,
               &vtaps_.weights[size_t(yy) * ksize], vtaps_.count[yy], line_.data(), n);
      write_line(line_.data(), out.width, base + yy * out.stride_h, out.stride_c, out.stride_w,
                 flip);
    }
  }

  jpeg_decompress_struct cinfo_{};
  ErrorManager err_{};
  EntropyDecoder entropy_;
  bool created_ = false, used_ = false;
  Taps htaps_, vtaps_;
  int x0_ = 0, y0_ = 0;  // the decoded window's first column and row, in scaled pixels
  std::vector<uint8_t> copy_;  // the file being decoded (see decode)
  std::vector<uint8_t> row_, rows_, line_;
};

// Each thread's decompressor, made on its first image and kept: the caller's thread keeps its
// own across calls, a worker's dies with the worker.
Decoder& this_thread_decoder() {
  thread_local Decoder decoder;
  return decoder;
}

}  // namespace

std::string jpeg_info(const ByteSpan& src, JpegInfo* info) {
  try {
    return this_thread_decoder().info(src, info);
  } catch (const std::bad_alloc&) {
    return "out of memory";
  }
}

size_t decoder_scratch_bytes() { return this_thread_decoder().scratch_bytes(); }

void decode_crop_resize(const std::vector<ByteSpan>& srcs, const int32_t* crops,
                        const uint8_t* flips, const OutView& out, int threads,
                        std::vector<std::string>* errors, const uint8_t* whole, bool index) {
  const int64_t n = int64_t(srcs.size());
  errors->assign(size_t(n), std::string());
  parallel_for(n, threads, [&](int64_t i) {
    std::string& err = (*errors)[size_t(i)];
    try {
      err = this_thread_decoder().decode(srcs[size_t(i)], crops + 4 * i, flips[i] != 0,
                                         whole == nullptr || whole[i] != 0, index, out, i);
    } catch (const std::bad_alloc&) {  // the thread's decoder, or the decode's buffers
      err = "out of memory";
    }
  });
}

}  // namespace fastdata
