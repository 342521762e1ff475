#include "collate.h"
#include "clones.h"
#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fastdata {
namespace {

struct Dim {
  int64_t n, ss, ds;  // extent, source byte stride, destination byte stride
};

// Normalises one copy into as few dimensions as possible, innermost last: size-1 dimensions
// dropped, dimensions ordered by destination stride (so writes are sequential), and neighbours
// merged where both sides are contiguous across them. An HWC image seen as CHW becomes two
// dimensions: (C, src stride 1, dst stride H*W) and (H*W, src stride C, dst stride 1).
int plan(int ndim, const int64_t* shape, const int64_t* ss, const int64_t* ds, Dim* out) {
  int m = 0;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] != 1) out[m++] = {shape[i], ss[i], ds[i]};
  }
  std::stable_sort(out, out + m, [](const Dim& a, const Dim& b) {
    return std::llabs(a.ds) > std::llabs(b.ds);
  });
  int k = 0;
  for (int i = 0; i < m; ++i) {
    if (k > 0 && out[k - 1].ss == out[i].ss * out[i].n && out[k - 1].ds == out[i].ds * out[i].n) {
      out[k - 1] = {out[k - 1].n * out[i].n, out[i].ss, out[i].ds};
    } else {
      out[k++] = out[i];
    }
  }
  return k;
}

// Planar from interleaved: dst[k * plane + i] = src[i * K + k]; and the reverse for
// channels_last. With K a constant the compiler turns these loops into byte shuffles, which
// need SSSE3 (pshufb): about 5x faster than what the compiler makes of them for baseline
// x86-64 (SSE2). So each kernel is compiled twice and the CPU picks at run time.
#define FASTDATA_PLANAR_KERNELS(NS, ATTR)                                                     \
  namespace NS {                                                                             \
  template <typename T, int K>                                                               \
  ATTR void deinterleave(const uint8_t* __restrict s, uint8_t* __restrict d, int64_t plane,  \
                         int64_t n) {                                                        \
    const T* src = reinterpret_cast<const T*>(s);                                            \
    T* out[K];                                                                               \
    for (int k = 0; k < K; ++k) out[k] = reinterpret_cast<T*>(d + k * plane);                \
    for (int64_t i = 0; i < n; ++i) {                                                        \
      for (int k = 0; k < K; ++k) out[k][i] = src[i * K + k];                                \
    }                                                                                        \
  }                                                                                          \
  template <typename T, int K>                                                               \
  ATTR void interleave(const uint8_t* __restrict s, uint8_t* __restrict d, int64_t plane,    \
                       int64_t n) {                                                          \
    const T* in[K];                                                                          \
    for (int k = 0; k < K; ++k) in[k] = reinterpret_cast<const T*>(s + k * plane);           \
    T* dst = reinterpret_cast<T*>(d);                                                        \
    for (int64_t i = 0; i < n; ++i) {                                                        \
      for (int k = 0; k < K; ++k) dst[i * K + k] = in[k][i];                                 \
    }                                                                                        \
  }                                                                                          \
  }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTDATA_HAVE_SSSE3 1
FASTDATA_PLANAR_KERNELS(ssse3, __attribute__((target("ssse3"))))
#endif
FASTDATA_PLANAR_KERNELS(generic, )

template <typename T>
void strided(const uint8_t* s, uint8_t* d, int64_t n, int64_t ss, int64_t ds) {
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<T*>(d + i * ds) = *reinterpret_cast<const T*>(s + i * ss);
  }
}

using Kernel = void (*)(const uint8_t*, uint8_t*, int64_t, int64_t);

template <typename T>
Kernel pick_planar(int k, bool to_planar) {
#if FASTDATA_HAVE_SSSE3
  static const bool fast = __builtin_cpu_supports("ssse3");
  if (fast) {
    switch (k) {
      case 2: return to_planar ? ssse3::deinterleave<T, 2> : ssse3::interleave<T, 2>;
      case 3: return to_planar ? ssse3::deinterleave<T, 3> : ssse3::interleave<T, 3>;
      case 4: return to_planar ? ssse3::deinterleave<T, 4> : ssse3::interleave<T, 4>;
      default: return nullptr;
    }
  }
#endif
  switch (k) {
    case 2: return to_planar ? generic::deinterleave<T, 2> : generic::interleave<T, 2>;
    case 3: return to_planar ? generic::deinterleave<T, 3> : generic::interleave<T, 3>;
    case 4: return to_planar ? generic::deinterleave<T, 4> : generic::interleave<T, 4>;
    default: return nullptr;
  }
}

Kernel pick_planar(int64_t itemsize, int64_t k, bool to_planar) {
  switch (itemsize) {
    case 1: return pick_planar<uint8_t>(int(k), to_planar);
    case 2: return pick_planar<uint16_t>(int(k), to_planar);
    case 4: return pick_planar<uint32_t>(int(k), to_planar);
    case 8: return pick_planar<uint64_t>(int(k), to_planar);
    default: return nullptr;
  }
}

void copy_one(const uint8_t* src, const int64_t* sstrides, uint8_t* dst, const int64_t* dstrides,
              int ndim, const int64_t* shape, int64_t es) {
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] == 0) return;
  }
  Dim dims[kMaxDims + 1];
  int m = plan(ndim, shape, sstrides, dstrides, dims);
  if (m == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  // Choose the innermost kernel; it consumes the last `inner` dimensions.
  const Dim& a = dims[m - 1];
  int inner = 1;
  enum { kMemcpy, kPlanar, kStrided } kind = kStrided;
  Kernel planar = nullptr;
  int64_t plane = 0, run = a.n;
  // The typed kernels load and store whole elements, which C++ allows only at addresses aligned
  // to them; numpy hands over sources that are not (frombuffer with an offset, a field of a
  // packed structured array). Strides are whole elements, so the two base addresses decide, and
  // misaligned copies take the per-element memcpy, which any address allows.
  const bool aligned = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) %
                        uintptr_t(es)) == 0;
  if (a.ss == es && a.ds == es) {
    kind = kMemcpy;
  } else if (m >= 2 && aligned) {
    const Dim& b = dims[m - 2];
    if (a.ds == es && b.ss == es && b.n <= 4 && a.ss == b.n * es && b.ds >= a.n * es) {
      // b: K channels (src stride es, dst stride = plane); a: n pixels of K interleaved values.
      planar = pick_planar(es, b.n, true);
      plane = b.ds;
      run = a.n;
    } else if (a.ds == es && b.ss == es && a.n <= 4 && b.ds == a.n * es && a.ss >= b.n * es) {
      // b: n pixels (dst stride K*es); a: K channels read from K planes (src stride = plane).
      planar = pick_planar(es, a.n, false);
      plane = a.ss;
      run = b.n;
    }
    if (planar) {
      kind = kPlanar;
      inner = 2;
    }
  }
  // Odometer over the outer dimensions.
  int outer = m - inner;
  int64_t idx[kMaxDims] = {0};
  const uint8_t* s = src;
  uint8_t* d = dst;
  while (true) {
    switch (kind) {
      case kMemcpy: std::memcpy(d, s, a.n * es); break;
      case kPlanar: planar(s, d, plane, run); break;
      case kStrided:
        switch (aligned ? es : 0) {
          case 1: strided<uint8_t>(s, d, a.n, a.ss, a.ds); break;
          case 2: strided<uint16_t>(s, d, a.n, a.ss, a.ds); break;
          case 4: strided<uint32_t>(s, d, a.n, a.ss, a.ds); break;
          case 8: strided<uint64_t>(s, d, a.n, a.ss, a.ds); break;
          default:
            for (int64_t i = 0; i < a.n; ++i) std::memcpy(d + i * a.ds, s + i * a.ss, es);
        }
        break;
    }
    int j = outer - 1;
    for (; j >= 0; --j) {
      s += dims[j].ss;
      d += dims[j].ds;
      if (++idx[j] < dims[j].n) break;
      s -= dims[j].ss * dims[j].n;
      d -= dims[j].ds * dims[j].n;
      idx[j] = 0;
    }
    if (j < 0) return;
  }
}

}  // namespace

void collate(const std::vector<ArrayView>& srcs, int ndim, const int64_t* shape, int64_t itemsize,
             uint8_t* dst, int64_t dst_batch_stride, const int64_t* dst_strides, int threads) {
  const int64_t n = int64_t(srcs.size());
  int64_t sample_bytes = itemsize;
  for (int d = 0; d < ndim; ++d) sample_bytes *= shape[d];
  parallel_for(n, threads_for_bytes(n * sample_bytes, threads), [&](int64_t i) {
    copy_one(srcs[i].data, srcs[i].strides, dst + i * dst_batch_stride, dst_strides, ndim, shape, itemsize);
  });
}

namespace {

template <typename T>
void lookup_one(const uint8_t* src, int64_t hw, int c, const T* lut, T* dst) {
  for (int ch = 0; ch < c; ++ch) {
    const T* table = lut + ch * 256;
    const uint8_t* s = src + ch;
    T* d = dst + ch * hw;
    for (int64_t i = 0; i < hw; ++i) d[i] = table[s[i * c]];
  }
}

// Calls fn(lut, dst) with both as pointers to the unsigned integers of `itemsize` bytes (1, 2,
// 4 or 8): a lookup copies a table's entries, whatever dtype they hold.
template <typename Fn>
void with_entries(int64_t itemsize, const uint8_t* lut, uint8_t* dst, const Fn& fn) {
  switch (itemsize) {
    case 1: fn(lut, dst); break;
    case 2: fn(reinterpret_cast<const uint16_t*>(lut), reinterpret_cast<uint16_t*>(dst)); break;
    case 4: fn(reinterpret_cast<const uint32_t*>(lut), reinterpret_cast<uint32_t*>(dst)); break;
    default: fn(reinterpret_cast<const uint64_t*>(lut), reinterpret_cast<uint64_t*>(dst)); break;
  }
}

// Rows [r0, r1) of lookup_values' [outer, c, inner] layout.
template <typename T>
void lookup_rows(const uint8_t* src, int64_t r0, int64_t r1, int c, int64_t inner, const T* lut, T* dst) {
  const int64_t row = int64_t(c) * inner;
  src += r0 * row;
  dst += r0 * row;
  if (inner == 1 && c == 3) {  // an RGB pixel a row: the channels_last batch, unrolled
    for (int64_t r = r0; r < r1; ++r, src += 3, dst += 3) {
      dst[0] = lut[src[0]];
      dst[1] = lut[256 + src[1]];
      dst[2] = lut[512 + src[2]];
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    for (int ch = 0; ch < c; ++ch, src += inner, dst += inner) {
      const T* table = lut + ch * 256;
      for (int64_t i = 0; i < inner; ++i) dst[i] = table[src[i]];
    }
  }
}


// One span of a pair of samples (u: sample i's values, v: sample j's), blended from the values as
// they were: u = rint(u * ai + v * bi) where `bu`, v = rint(v * aj + u * bj) where `bv`; each
// product and the sum rounded to float, then to the nearest integer, ties to even (torch.round).
// The caller keeps each weight in [0, 1], so every result lies in [0, 255]. (A loop per case, each
// vectorised; not a template: Clang's target_clones takes none.)
FASTDATA_AVX2_CLONE void blend_span(uint8_t* u, uint8_t* v, int64_t len, float ai, float bi, float aj, float bj,
                                    bool bu, bool bv) {
  if (bu && bv) {
    for (int64_t t = 0; t < len; ++t) {
      const float x = float(u[t]), y = float(v[t]);
      const float p = x * ai, q = y * bi, r = y * aj, s = x * bj;
      u[t] = uint8_t(std::nearbyint(p + q));
      v[t] = uint8_t(std::nearbyint(r + s));
    }
  } else if (bu) {
    for (int64_t t = 0; t < len; ++t) {
      const float p = float(u[t]) * ai, q = float(v[t]) * bi;
      u[t] = uint8_t(std::nearbyint(p + q));
    }
  } else if (bv) {
    for (int64_t t = 0; t < len; ++t) {
      const float r = float(v[t]) * aj, s = float(u[t]) * bj;
      v[t] = uint8_t(std::nearbyint(r + s));
    }
  }
}

}  // namespace

void lookup_values(const uint8_t* src, int64_t outer, int c, int64_t inner, const uint8_t* lut, int64_t itemsize,
                   uint8_t* dst, int threads) {
  const int64_t row = int64_t(c) * inner;
  if (outer == 0 || row == 0) return;
  const int64_t rows = std::max<int64_t>(1, (int64_t(1) << 18) / row);  // about 256K values a chunk
  const int64_t chunks = (outer + rows - 1) / rows;
  parallel_for(chunks, threads_for_bytes(outer * row * itemsize, threads), [&](int64_t k) {
    const int64_t r0 = k * rows, r1 = std::min(outer, r0 + rows);
    with_entries(itemsize, lut, dst, [&](auto table, auto out) { lookup_rows(src, r0, r1, c, inner, table, out); });
  });
}

void lookup_planes(const uint8_t* src, int64_t n, int64_t hw, int c, const uint8_t* lut, int64_t itemsize,
                   uint8_t* dst, int threads) {
  parallel_for(n, threads_for_bytes(n * hw * c * itemsize, threads), [&](int64_t i) {
    with_entries(itemsize, lut, dst + i * hw * c * itemsize,
                 [&](auto table, auto out) { lookup_one(src + i * hw * c, hw, c, table, out); });
  });
}

void mix_rolled(float* x, int64_t n, int64_t per, float a, float b, int threads) {
  if (n == 0 || per == 0) return;
  // Spans of the samples' values, each blended down the whole batch: a span of sample i-1 is
  // still as laid out when sample i reads it, and the last sample's is kept before sample n-1
  // overwrites it, for sample 0.
  constexpr int64_t kSpan = 4096;
  const int64_t spans = (per + kSpan - 1) / kSpan;
  parallel_for(spans, threads_for_bytes(n * per * int64_t(sizeof(float)), threads), [&](int64_t k) {
    const int64_t j0 = k * kSpan, len = std::min(kSpan, per - j0);
    float last[kSpan];
    std::copy(x + (n - 1) * per + j0, x + (n - 1) * per + j0 + len, last);
    for (int64_t i = n - 1; i >= 0; --i) {
      float* cur = x + i * per + j0;
      const float* prev = i ? x + (i - 1) * per + j0 : last;
      for (int64_t j = 0; j < len; ++j) {
        const float p = prev[j] * a, q = cur[j] * b;
        cur[j] = p + q;
      }
    }
  });
}

void mix_reversed(uint8_t* x, int64_t n, int64_t per, const float* a, const float* b, const uint8_t* blend,
                  int threads) {
  const int64_t pairs = n / 2;
  if (pairs == 0 || per == 0) return;
  constexpr int64_t kSpan = 1 << 16;
  const int64_t spans = (per + kSpan - 1) / kSpan;
  parallel_for(pairs * spans, threads_for_bytes(n * per, threads), [&](int64_t k) {
    const int64_t i = k / spans, j = n - 1 - i, t0 = (k % spans) * kSpan, len = std::min(kSpan, per - t0);
    uint8_t* u = x + i * per + t0;
    uint8_t* v = x + j * per + t0;
    blend_span(u, v, len, a[i], b[i], a[j], b[j], blend[i] != 0, blend[j] != 0);
  });
}

void mix_add(float* acc, const uint8_t* src, int64_t n, float w, bool first) {
  if (first) {
    for (int64_t j = 0; j < n; ++j) acc[j] = w * float(src[j]);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float p = w * float(src[j]);
    acc[j] = acc[j] + p;
  }
}

}  // namespace fastdata
