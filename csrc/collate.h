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

}  // namespace fastdata
