// libFuzzer target for the native collation (csrc/collate.cpp): samples of an input-chosen
// shape and element size, each with its own byte strides (any order, padded, reversed, zero as
// in a broadcast view, and a base address off the element alignment as numpy's
// frombuffer(offset=1) gives), copied into a batch of its own strides on 1-3 threads.
//
// Input, read byte by byte (zeros past the end; tests/robustness/test_fuzz.py `collate_case` reads the
// same):
//   ndim (b % 6), element size ({1, 2, 4, 8, 16}[b % 5]), samples and threads
//   (1 + b % 4, 1 + (b >> 2) % 3), one extent per dimension (b % 6), then the batch's layout and
//   each sample's layout (see `layout`).
//
// What fails the run, beside ASan/UBSan reports and crashes: any byte of the batch buffer that
// differs from an element-by-element reference copy (so a wrong value, and a write to the
// padding between rows or samples, alike). Every buffer holds exactly its view's span, so ASan
// sees any read or write past it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../collate.h"
#include "fuzz_input.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "collate_fuzzer: %s\n", what);
  std::abort();
}

constexpr int64_t kItemSizes[5] = {1, 2, 4, 8, 16};

// One array's strides: dimensions in an input-chosen order (innermost first), each padded by
// 0-2 elements; for a source also each stride negated or zeroed, and the base address moved off
// the element alignment (the batch is always aligned: it is a fresh tensor). Reads 2 * ndim + 2
// bytes either way.
struct Layout {
  int64_t strides[fastdata::kMaxDims] = {};
  int64_t lo = 0, hi = 0;  // byte span of the elements, relative to element 0
  int64_t misalign = 0;

  Layout(fastdata_fuzz::Cursor& in, int ndim, const int64_t* shape, int64_t es, bool source) {
    int order[fastdata::kMaxDims];
    for (int d = 0; d < ndim; ++d) order[d] = d;
    for (int d = 0; d < ndim; ++d) std::swap(order[d], order[d + in.byte() % (ndim - d)]);
    const uint8_t pads = in.byte(), align = in.byte();
    int64_t step = es;
    for (int k = 0; k < ndim; ++k) {
      const int d = order[k];
      strides[d] = step;
      step = step * std::max<int64_t>(shape[d], 1) + ((pads >> (k % 4 * 2)) % 3) * es;
    }
    if (source) {
      for (int d = 0; d < ndim; ++d) {
        const uint8_t s = in.byte() % 4;  // 0, 1: as laid out; 2: reversed; 3: broadcast
        if (s == 2) strides[d] = -strides[d];
        if (s == 3) strides[d] = 0;
      }
      if (es > 1 && (align & 1)) misalign = 1 + (align >> 1) % (es - 1);
    } else {
      for (int d = 0; d < ndim; ++d) in.byte();  // same length either way
    }
    for (int d = 0; d < ndim; ++d) {
      const int64_t reach = (std::max<int64_t>(shape[d], 1) - 1) * strides[d];
      (reach < 0 ? lo : hi) += reach;
    }
    hi += es;
  }
};

// The reference: element by element, in index order.
void reference_copy(const uint8_t* src, const int64_t* ss, uint8_t* dst, const int64_t* ds,
                    int ndim, const int64_t* shape, int64_t es) {
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return;
  }
  int64_t idx[fastdata::kMaxDims] = {};
  while (true) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < ndim; ++d) so += idx[d] * ss[d], dof += idx[d] * ds[d];
    std::memcpy(dst + dof, src + so, size_t(es));
    int d = ndim - 1;
    for (; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
    if (d < 0) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fastdata_fuzz::Cursor in{data, size};
  const int ndim = in.byte() % 6;
  const int64_t es = kItemSizes[in.byte() % 5];
  const uint8_t counts = in.byte();
  const int n = 1 + counts % 4, threads = 1 + (counts >> 2) % 3;
  int64_t shape[fastdata::kMaxDims];
  for (int d = 0; d < ndim; ++d) shape[d] = in.byte() % 6;

  Layout out_layout(in, ndim, shape, es, false);
  const int64_t span = out_layout.hi - out_layout.lo;  // lo is 0: no negative strides
  const int64_t batch_stride = span + (in.byte() % 3) * es;
  const size_t out_bytes = size_t((n - 1) * batch_stride + span);
  std::vector<uint8_t> got(out_bytes, 0xA5), want(out_bytes, 0xA5);

  std::vector<std::vector<uint8_t>> buffers;
  std::vector<fastdata::ArrayView> views(static_cast<size_t>(n));
  buffers.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    Layout l(in, ndim, shape, es, true);
    buffers.emplace_back(size_t(l.misalign + l.hi - l.lo));
    std::vector<uint8_t>& b = buffers.back();
    for (size_t k = 0; k < b.size(); ++k) b[k] = uint8_t(k * 131 + 7 * i + 1);
    views[size_t(i)].data = b.data() + l.misalign - l.lo;
    std::copy(l.strides, l.strides + ndim, views[size_t(i)].strides);
    reference_copy(views[size_t(i)].data, l.strides, want.data() + i * batch_stride,
                   out_layout.strides, ndim, shape, es);
  }
  fastdata::collate(views, ndim, shape, es, got.data(), batch_stride, out_layout.strides, threads);
  if (got != want) fail("the batch differs from the element-by-element copy");
  return 0;
}
