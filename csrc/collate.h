// Native collation: copy N same-shape arrays, each with its own byte strides, into one batch
// buffer with byte strides of its own (contiguous NCHW, channels_last, or anything else).
// Works on raw pointers only: no Python, no torch, so it runs with the GIL released.
#pragma once
#include <cstdint>
#include <vector>

namespace fastdata {

constexpr int kMaxDims = 16;

struct ArrayView {
  const uint8_t* data;
  int64_t strides[kMaxDims];  // in bytes, may be negative
};

// Copies srcs[i] (shape `shape`, element size `itemsize`) to dst + i * dst_batch_stride with
// per-dimension byte strides `dst_strides`, on up to `threads` threads.
void collate(const std::vector<ArrayView>& srcs, int ndim, const int64_t* shape, int64_t itemsize,
             uint8_t* dst, int64_t dst_batch_stride, const int64_t* dst_strides, int threads);

// Lays out n interleaved images (uint8 [n, hw, c]) as planes (dst: [n, c, hw] elements of
// `itemsize` bytes), each value replaced by its channel's entry in `lut` ([c, 256] elements of
// `itemsize` bytes): any per-value conversion (uint8 to float, scaled, normalized) in one pass,
// with the caller's exact values. On up to `threads` threads.
void lookup_planes(const uint8_t* src, int64_t n, int64_t hw, int c, const uint8_t* lut, int64_t itemsize,
                   uint8_t* dst, int threads);

// Replaces each value of `outer` rows of [c, inner] uint8 values (src; channels_last images:
// [n * h * w, c, 1]; contiguous NCHW: [n, c, h * w]) by its channel's entry in `lut` ([c, 256]
// elements of `itemsize` bytes), into dst of the same layout: lookup_planes without the change
// of layout. On up to `threads` threads.
void lookup_values(const uint8_t* src, int64_t outer, int c, int64_t inner, const uint8_t* lut, int64_t itemsize,
                   uint8_t* dst, int threads);

// MixUp's blend of a batch with itself rolled by one sample, in place: x[i] = x[i-1] * a + x[i] * b
// for n samples of `per` float values each (x[-1]: the last sample, as it was), each product and
// the sum rounded to float as torchvision's `x.roll(1, 0).mul_(a).add_(x.mul(b))` rounds them
// (so the file is built without fused multiply-adds). On up to `threads` threads.
void mix_rolled(float* x, int64_t n, int64_t per, float a, float b, int threads);

// timm's FastCollateMixup blend, in place on n samples of `per` uint8 values: for each pair
// (i, j = n - 1 - i), i < j, from the values as they were, x_i = rint(x_i * a[i] + x_j * b[i])
// where blend[i] and x_j = rint(x_j * a[j] + x_i * b[j]) where blend[j]: each product and the
// sum rounded to float, ties to even, as timm's `(x.float() * lam + y.float() * (1 - lam))`,
// `torch.round` and `.byte()` give them. Weights in [0, 1] (the caller's check). On up to
// `threads` threads.
void mix_reversed(uint8_t* x, int64_t n, int64_t per, const float* a, const float* b, const uint8_t* blend,
                  int threads);

// AugMix's mixing of n values: acc[j] = w * src[j] (first) or acc[j] + w * src[j], the product
// and the sum each rounded to float as torch's `w * image` and `mix.add_(...)` round them.
void mix_add(float* acc, const uint8_t* src, int64_t n, float w, bool first);

}  // namespace fastdata
