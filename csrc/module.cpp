// The one binding file: Python sees raw buffers (numpy arrays, or torch tensors through DLPack)
// and never links against libtorch, so the build needs no torch and fits every torch version.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "collate.h"

namespace nb = nanobind;

namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::device::cpu>;

std::string shape_str(size_t ndim, const int64_t* shape) {
  std::string s = "[";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Copies the views into out (rows along dimension 0) with the GIL released.
void copy_to_out(const std::vector<fastdata::ArrayView>& views, OutArray& out, int64_t itemsize,
                 int threads) {
  const int ndim = int(out.ndim()) - 1;
  int64_t shape[fastdata::kMaxDims], dst_strides[fastdata::kMaxDims];
  for (int d = 0; d < ndim; ++d) {
    shape[d] = out.shape(d + 1);
    dst_strides[d] = out.stride(d + 1) * itemsize;
  }
  uint8_t* dst = static_cast<uint8_t*>(out.data());
  const int64_t batch_stride = out.stride(0) * itemsize;
  nb::gil_scoped_release release;
  fastdata::collate(views, ndim, shape, itemsize, dst, batch_stride, dst_strides, threads);
}

// collate(samples, out, threads): out[i] = samples[i] for every i, values copied bit for bit
// whatever the strides on either side. Shapes and dtypes must match exactly; the Python side
// sends anything else to torch's default_collate.
void collate(nb::list samples, OutArray out, int threads) {
  const size_t n = nb::len(samples);
  if (out.ndim() < 1 || out.ndim() > fastdata::kMaxDims + 1 || out.shape(0) != n) {
    throw nb::value_error(("out should have shape [" + std::to_string(n) +
                           ", ...] for that many samples, but got " +
                           shape_str(out.ndim(), out.shape_ptr()))
                              .c_str());
  }
  const int ndim = int(out.ndim()) - 1;
  const nb::dlpack::dtype dt = out.dtype();
  const int64_t itemsize = (dt.bits * dt.lanes + 7) / 8;
  std::vector<AnyArray> keep;  // keeps each source's buffer alive while the GIL is released
  keep.reserve(n);
  std::vector<fastdata::ArrayView> views(n);
  for (size_t i = 0; i < n; ++i) {
    keep.push_back(nb::cast<AnyArray>(samples[i]));
    const AnyArray& a = keep.back();
    if (int(a.ndim()) != ndim || a.dtype() != dt) {
      throw nb::value_error(("sample " + std::to_string(i) + " should have " +
                             std::to_string(ndim) + " dimensions and the batch's dtype")
                                .c_str());
    }
    for (int d = 0; d < ndim; ++d) {
      if (int64_t(a.shape(d)) != int64_t(out.shape(d + 1))) {
        throw nb::value_error(("sample " + std::to_string(i) + " should have shape " +
                               shape_str(ndim, out.shape_ptr() + 1) + ", but got " +
                               shape_str(ndim, a.shape_ptr()))
                                  .c_str());
      }
      views[i].strides[d] = a.stride(d) * itemsize;
    }
    views[i].data = static_cast<const uint8_t*>(a.data());
  }
  copy_to_out(views, out, itemsize, threads);
}

// collate_ptrs(addresses, strides, out, threads): as collate, for sources given as raw data
// addresses and flat element strides (ndim per sample). Exporting a torch tensor through DLPack
// costs about 3 us, a third of the whole collation of 64 small tensors; the caller reads
// `data_ptr()` and `stride()` instead, and holds the tensors alive and checked (same shape and
// dtype as out[0]) while this runs.
void collate_ptrs(const std::vector<uintptr_t>& addresses, const std::vector<int64_t>& strides,
                  OutArray out, int threads) {
  const size_t n = addresses.size();
  if (out.ndim() < 1 || out.ndim() > fastdata::kMaxDims + 1 || out.shape(0) != n) {
    throw nb::value_error("out should have one row per address");
  }
  const int ndim = int(out.ndim()) - 1;
  if (strides.size() != n * size_t(ndim)) {
    throw nb::value_error("strides should hold ndim strides per address");
  }
  const nb::dlpack::dtype dt = out.dtype();
  const int64_t itemsize = (dt.bits * dt.lanes + 7) / 8;
  std::vector<fastdata::ArrayView> views(n);
  for (size_t i = 0; i < n; ++i) {
    views[i].data = reinterpret_cast<const uint8_t*>(addresses[i]);
    for (int d = 0; d < ndim; ++d) views[i].strides[d] = strides[i * ndim + d] * itemsize;
  }
  copy_to_out(views, out, itemsize, threads);
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "fastdata's native core: collation on raw buffers, GIL released.";
  m.def("collate", &collate, nb::arg("samples"), nb::arg("out"), nb::arg("threads") = 1,
        "Copy samples[i] into out[i] for every i with up to `threads` threads, GIL released.");
  m.def("collate_ptrs", &collate_ptrs, nb::arg("addresses"), nb::arg("strides"), nb::arg("out"),
        nb::arg("threads") = 1, "collate() for sources given as data addresses and element strides.");
}
