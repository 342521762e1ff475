// The one binding file: Python sees raw buffers (numpy arrays, or torch tensors through DLPack)
// and never links against libtorch, so the build needs no torch and fits every torch version.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "blur.h"
#include "bytes.h"
#include "collate.h"
#include "color.h"
#include "geometry.h"
#include "parallel.h"
#include "read.h"
#include "resample.h"
#include "tar.h"
#include "index.h"  // (the keyed hash of `stamps`; the checkpoint index the decoder keeps)
#ifdef FASTDATA_HAVE_JPEG
#include "decode.h"
#endif

namespace nb = nanobind;

namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::device::cpu>;

std::string shape_str(size_t ndim, const int64_t* shape) {
  std::string s = "[";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The binding's one form of a shape error: "<expected>, but got [<shape>]" as ValueError.
[[noreturn]] void shape_error(const std::string& expected, size_t ndim, const int64_t* shape) {
  throw nb::value_error((expected + ", but got " + shape_str(ndim, shape)).c_str());
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
    shape_error("out should have shape [" + std::to_string(n) + ", ...] for that many samples", out.ndim(),
                out.shape_ptr());
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
        shape_error("sample " + std::to_string(i) + " should have shape " + shape_str(ndim, out.shape_ptr() + 1),
                    ndim, a.shape_ptr());
      }
      views[i].strides[d] = a.stride(d) * itemsize;
    }
    views[i].data = static_cast<const uint8_t*>(a.data());
  }
  copy_to_out(views, out, itemsize, threads);
}

// collate_ptrs(addresses, strides, out, threads): as collate, for sources given as raw data
// addresses and flat element strides (ndim per sample). Exporting a torch tensor through DLPack
// costs more than collating a small tensor; the caller reads
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

// Whether an array's elements are contiguous in C order (a dimension of size 1 has any stride).
template <typename A>
bool contiguous(const A& a) {
  int64_t expect = 1;
  for (int d = int(a.ndim()) - 1; d >= 0; --d) {
    if (a.shape(d) != 1 && a.stride(d) != expect) return false;
    expect *= int64_t(a.shape(d));
  }
  return true;
}

// A table lookup's arrays as the native core takes them, checked: uint8 src, lut and out of one
// dtype of 1, 2, 4 or 8 bytes, all contiguous, and `shapes` (the caller's check of its layout).
// ValueError "<name> takes <form>" or "<name> takes contiguous arrays" otherwise.
struct LookupArrays {
  const uint8_t* src;
  const uint8_t* lut;
  uint8_t* out;
  int64_t itemsize;
};

LookupArrays lookup_arrays(const char* name, const char* form, bool shapes, const AnyArray& src, const AnyArray& lut,
                           OutArray& out) {
  const nb::dlpack::dtype dt = out.dtype();
  const int64_t itemsize = (dt.bits * dt.lanes + 7) / 8;
  if (!shapes || src.dtype() != nb::dtype<uint8_t>() || lut.dtype() != dt ||
      !(itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8)) {
    throw nb::value_error((std::string(name) + " takes " + form).c_str());
  }
  if (!contiguous(src) || !contiguous(lut) || !contiguous(out)) {
    throw nb::value_error((std::string(name) + " takes contiguous arrays").c_str());
  }
  return {static_cast<const uint8_t*>(src.data()), static_cast<const uint8_t*>(lut.data()),
          static_cast<uint8_t*>(out.data()), itemsize};
}

// The arrays of a colour conversion: uint8 src and out of one shape [..., 3], contiguous.
void color_arrays(const char* name, const AnyArray& src, const OutArray& out) {
  bool same = src.ndim() == out.ndim() && src.ndim() >= 1 && src.shape(src.ndim() - 1) == 3;
  for (size_t d = 0; same && d < src.ndim(); ++d) same = src.shape(d) == out.shape(d);
  if (!same || src.dtype() != nb::dtype<uint8_t>() || out.dtype() != nb::dtype<uint8_t>()) {
    throw nb::value_error((std::string(name) + " takes uint8 src and out of one shape [..., 3]").c_str());
  }
  if (!contiguous(src) || !contiguous(out)) {
    throw nb::value_error((std::string(name) + " takes contiguous arrays").c_str());
  }
}

// hue_shift(src, out, shift): Pillow's RGB -> HSV, hue + shift modulo 256, HSV -> RGB (color.h).
void hue_shift(AnyArray src, OutArray out, int shift) {
  color_arrays("hue_shift", src, out);
  if (shift < 0 || shift > 255) throw nb::value_error("hue_shift takes a shift of 0 to 255");
  nb::gil_scoped_release release;
  fastdata::hue_shift(static_cast<const uint8_t*>(src.data()), static_cast<uint8_t*>(out.data()),
                      int64_t(src.size() / 3), shift);
}

// enhance(src, out, kind, factor, luma, lanes): Pillow's ImageEnhance Brightness (0), Contrast (1),
// Color (2) or Sharpness (3, of an image [H, W, 3]) of uint8 RGB pixels, enhance(factor), "L" with
// the weights luma = (r, g, b, shift), Pillow's own past each row's whole groups of `lanes`
// (Pillow-SIMD's conversion; rows: src's [..., W, 3], else one) (color.h).
void enhance(AnyArray src, OutArray out, int kind, double factor, std::array<int, 4> luma, int lanes) {
  color_arrays("enhance", src, out);
  if (kind < 0 || kind > 3) {
    throw nb::value_error("enhance takes kind 0 (Brightness), 1 (Contrast), 2 (Color) or 3 (Sharpness)");
  }
  if (kind == 3) {  // (a filter over rows: the image's shape, [H, W, 3])
    if (src.ndim() != 3 || src.shape(0) >= (size_t(1) << 30) || src.shape(1) >= (size_t(1) << 30)) {
      throw nb::value_error("enhance's Sharpness takes an image [H, W, 3] of under 2^30 pixels a side");
    }
    nb::gil_scoped_release release;
    fastdata::sharpness(static_cast<const uint8_t*>(src.data()), static_cast<uint8_t*>(out.data()),
                        int(src.shape(1)), int(src.shape(0)), float(factor));
    return;
  }
  const bool weights = luma[0] >= 0 && luma[1] >= 0 && luma[2] >= 0 && luma[3] >= 1 && luma[3] <= 16 &&
                       int64_t(luma[0]) + luma[1] + luma[2] <= (int64_t(1) << luma[3]);
  if (!weights) throw nb::value_error("enhance takes luma weights (r, g, b, shift) of sum at most 2^shift, shift 1 to 16");
  if (lanes < 0 || lanes > 64) throw nb::value_error("enhance takes lanes 0 to 64");
  const int64_t width = src.ndim() >= 3 ? int64_t(src.shape(src.ndim() - 2)) : 0;  // (rows of pixels [..., W, 3])
  nb::gil_scoped_release release;
  fastdata::enhance(static_cast<const uint8_t*>(src.data()), static_cast<uint8_t*>(out.data()),
                    int64_t(src.size() / 3), kind, float(factor),  // (Pillow's blend takes the factor as a float)
                    {luma[0], luma[1], luma[2], luma[3], lanes}, width);
}

// tensor_enhance(src, out, kind, factor): torchvision's Brightness (0), Contrast (1), Color (2) or
// Sharpness (3) tensor kernel (v1's) of a uint8 image [C, H, W] into out (color.h).
void tensor_enhance(AnyArray src, OutArray out, int kind, double factor) {
  bool same = src.ndim() == 3 && out.ndim() == 3 && src.dtype() == nb::dtype<uint8_t>() &&
              out.dtype() == nb::dtype<uint8_t>();
  for (size_t d = 0; same && d < 3; ++d) same = src.shape(d) == out.shape(d) && src.shape(d) < (size_t(1) << 30);
  const int c = same ? int(src.shape(0)) : 0, h = same ? int(src.shape(1)) : 0, w = same ? int(src.shape(2)) : 0;
  if (!same || !(c == 1 || c == 3) || (kind == 2 && c != 3) || (kind == 3 && (h < 3 || w < 3))) {
    throw nb::value_error("tensor_enhance takes uint8 src and out of one shape [C, H, W], C 1 or 3 (Color: 3; "
                          "Sharpness: H and W at least 3), each side under 2^30");
  }
  if (!contiguous(src) || !contiguous(out)) throw nb::value_error("tensor_enhance takes contiguous arrays");
  if (kind < 0 || kind > 3) {
    throw nb::value_error("tensor_enhance takes kind 0 (Brightness), 1 (Contrast), 2 (Color) or 3 (Sharpness)");
  }
  if (kind == 1 && int64_t(h) * w * 255 >= (int64_t(1) << 24)) {
    throw nb::value_error("tensor_enhance's Contrast takes an image of H x W x 255 under 2^24 (its sum exact)");
  }
  if (!(factor >= 0.0)) throw nb::value_error("tensor_enhance takes a factor >= 0");
  if (src.data() == out.data()) throw nb::value_error("tensor_enhance takes an out apart from src");
  nb::gil_scoped_release release;
  fastdata::tensor_enhance(static_cast<const uint8_t*>(src.data()), static_cast<uint8_t*>(out.data()), c, h, w,
                           kind, factor);
}

// affine(src, out, data, resample, fill): Pillow's Image.transform(size, AFFINE, data, resample,
// fillcolor=fill) of uint8 pixels [H, W, C], C 1 ("L") or 3 ("RGB"), into out [H2, W2, C] (geometry.h).
void affine(AnyArray src, OutArray out, std::array<double, 6> data, int resample, std::vector<int> fill) {
  const bool shapes = src.ndim() == 3 && out.ndim() == 3 && src.shape(2) == out.shape(2) &&
                      (src.shape(2) == 1 || src.shape(2) == 3) && src.dtype() == nb::dtype<uint8_t>() &&
                      out.dtype() == nb::dtype<uint8_t>();
  if (!shapes) throw nb::value_error("affine takes uint8 src [H, W, C] and out [H2, W2, C], C 1 or 3");
  if (!contiguous(src) || !contiguous(out)) throw nb::value_error("affine takes contiguous arrays");
  const int64_t limit = int64_t(1) << 30;  // (sizes as ints, as Pillow's)
  for (int d = 0; d < 2; ++d) {
    if (int64_t(src.shape(d)) >= limit || int64_t(out.shape(d)) >= limit) {
      throw nb::value_error("affine takes images of under 2^30 pixels a side");
    }
  }
  if (resample != 0 && resample != 2 && resample != 3) {
    throw nb::value_error("affine takes resample 0 (nearest), 2 (bilinear) or 3 (bicubic)");
  }
  const size_t c = src.shape(2);
  bool byte_fill = fill.size() == c;
  uint8_t fills[3] = {0, 0, 0};
  for (size_t k = 0; byte_fill && k < c; ++k) {
    byte_fill = fill[k] >= 0 && fill[k] <= 255;
    fills[k] = uint8_t(byte_fill ? fill[k] : 0);
  }
  if (!byte_fill) throw nb::value_error("affine takes a fill of one value 0 to 255 a channel");
  const auto* s = static_cast<const uint8_t*>(src.data());
  auto* o = static_cast<uint8_t*>(out.data());
  if (src.nbytes() && out.nbytes() && s < o + out.nbytes() && o < s + src.nbytes()) {
    throw nb::value_error("affine takes an out that does not overlap src");
  }
  nb::gil_scoped_release release;
  fastdata::affine(s, int(src.shape(1)), int(src.shape(0)), int(c), o, int(out.shape(1)), int(out.shape(0)),
                   data.data(), resample, fills);
}

// resize_images(src, out, boxes, resample, vertical_first, weights, threads): out[i] = Pillow's resize
// of the box boxes[i] = (x0, y0, x1, y1) (whole pixels, inside the image) cut from src[i]: uint8 src
// [N, H, W, C] and out [N, OH, OW, C], C 1 ("L") or 3 ("RGB"), contiguous; boxes int64 [N, 4];
// resample "bilinear" or "bicubic"; vertical_first None or uint8 [N], nonzero where that image's
// vertical pass comes first; weights "pillow" or "pillow-simd" (resample.h).
void resize_images(AnyArray src, OutArray out, AnyArray boxes, const std::string& resample,
                   std::optional<AnyArray> vertical_first, const std::string& weights, int threads) {
  const bool shapes = src.ndim() == 4 && out.ndim() == 4 && src.shape(0) == out.shape(0) &&
                      src.shape(3) == out.shape(3) && (src.shape(3) == 1 || src.shape(3) == 3) &&
                      src.dtype() == nb::dtype<uint8_t>() && out.dtype() == nb::dtype<uint8_t>();
  if (!shapes) throw nb::value_error("resize_images takes uint8 src [N, H, W, C] and out [N, OH, OW, C], C 1 or 3");
  const int64_t n = int64_t(src.shape(0));
  for (int d = 1; d < 3; ++d) {
    // (a row's RGBX bytes, 4 a pixel, and the kernels' counts fit int)
    if (src.shape(d) < 1 || out.shape(d) < 1 || int64_t(src.shape(d)) >= (int64_t(1) << 28) ||
        int64_t(out.shape(d)) >= (int64_t(1) << 28)) {
      throw nb::value_error("resize_images takes images of 1 to 2^28 - 1 pixels a side");
    }
  }
  if (!contiguous(src) || !contiguous(out)) throw nb::value_error("resize_images takes contiguous arrays");
  if (boxes.ndim() != 2 || int64_t(boxes.shape(0)) != n || boxes.shape(1) != 4 ||
      boxes.dtype() != nb::dtype<int64_t>() || !contiguous(boxes)) {
    shape_error("boxes should be a contiguous int64 array of shape [" + std::to_string(n) + ", 4]", boxes.ndim(),
                boxes.shape_ptr());
  }
  const int h = int(src.shape(1)), w = int(src.shape(2));
  const auto* b = static_cast<const int64_t*>(boxes.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* box = b + 4 * i;
    if (!(0 <= box[0] && box[0] < box[2] && box[2] <= w && 0 <= box[1] && box[1] < box[3] && box[3] <= h)) {
      throw nb::value_error(("resize_images takes boxes inside the image, but box " + std::to_string(i) +
                             " is not").c_str());
    }
  }
  const uint8_t* first = nullptr;
  if (vertical_first.has_value()) {
    if (vertical_first->ndim() != 1 || int64_t(vertical_first->shape(0)) != n ||
        vertical_first->dtype() != nb::dtype<uint8_t>() || !contiguous(*vertical_first)) {
      shape_error("vertical_first should be a contiguous uint8 array of shape [" + std::to_string(n) + "]",
                  vertical_first->ndim(), vertical_first->shape_ptr());
    }
    first = static_cast<const uint8_t*>(vertical_first->data());
  }
  if (resample != "bilinear" && resample != "bicubic") {
    throw nb::value_error(("resample should be 'bilinear' or 'bicubic', not '" + resample + "'").c_str());
  }
  if (weights != "pillow" && weights != "pillow-simd") {
    throw nb::value_error(("weights should be 'pillow' or 'pillow-simd', not '" + weights + "'").c_str());
  }
  const auto* s = static_cast<const uint8_t*>(src.data());
  auto* o = static_cast<uint8_t*>(out.data());
  if (src.nbytes() && out.nbytes() && s < o + out.nbytes() && o < s + src.nbytes()) {
    throw nb::value_error("resize_images takes an out that does not overlap src");
  }
  fastdata::Resize r;
  r.filter = resample == "bicubic" ? fastdata::Filter::kBicubic : fastdata::Filter::kBilinear;
  r.int16_weights = weights == "pillow-simd";
  nb::gil_scoped_release release;
  fastdata::resize_images(s, n, h, w, int(src.shape(3)), b, o, int(out.shape(1)), int(out.shape(2)), r, first,
                          std::max(1, threads));
}

// gaussian_blur(src, out, xradius, yradius): Pillow's Image.gaussian_blur((xradius, yradius)) of
// uint8 pixels [H, W, C], C 1 ("L") or 3 ("RGB"), into out of the same shape (blur.h); the radii
// taken as Pillow's C call takes them (floats). False, out untouched, where a box radius is past
// what Pillow's sums hold (or not a number) or where one axis alone is blurred: the caller then
// calls Pillow.
bool gaussian_blur(AnyArray src, OutArray out, double xradius, double yradius) {
  const bool shapes = src.ndim() == 3 && out.ndim() == 3 && (src.shape(2) == 1 || src.shape(2) == 3) &&
                      src.dtype() == nb::dtype<uint8_t>() && out.dtype() == nb::dtype<uint8_t>() &&
                      src.shape(0) == out.shape(0) && src.shape(1) == out.shape(1) && src.shape(2) == out.shape(2);
  if (!shapes) throw nb::value_error("gaussian_blur takes uint8 src and out [H, W, C] of one shape, C 1 or 3");
  if (!contiguous(src) || !contiguous(out)) throw nb::value_error("gaussian_blur takes contiguous arrays");
  if (int64_t(src.shape(0)) >= (int64_t(1) << 30) || int64_t(src.shape(1)) >= (int64_t(1) << 30)) {
    throw nb::value_error("gaussian_blur takes images of under 2^30 pixels a side");
  }
  const auto* s = static_cast<const uint8_t*>(src.data());
  auto* o = static_cast<uint8_t*>(out.data());
  if (src.nbytes() && s < o + out.nbytes() && o < s + src.nbytes()) {
    throw nb::value_error("gaussian_blur takes an out that does not overlap src");
  }
  constexpr int kPasses = 3;  // (Image.gaussian_blur's default, which ImageFilter.GaussianBlur takes)
  const float bx = fastdata::gaussian_box_radius(float(xradius), kPasses);
  const float by = fastdata::gaussian_box_radius(float(yradius), kPasses);
  if (!fastdata::box_radius_ok(bx) || !fastdata::box_radius_ok(by)) return false;
  if ((bx == 0) != (by == 0)) return false;  // (one axis alone: Pillow-SIMD's red band is 255s there)
  nb::gil_scoped_release release;
  fastdata::box_blur(s, o, int(src.shape(0)), int(src.shape(1)), int(src.shape(2)), bx, by, kPasses);
  return true;
}

// convert_hsv(src, out, to_hsv): Pillow's RGB -> HSV (to_hsv) or HSV -> RGB conversion alone.
void convert_hsv(AnyArray src, OutArray out, bool to_hsv) {
  color_arrays("convert_hsv", src, out);
  nb::gil_scoped_release release;
  const auto convert = to_hsv ? fastdata::rgb_to_hsv : fastdata::hsv_to_rgb;
  convert(static_cast<const uint8_t*>(src.data()), static_cast<uint8_t*>(out.data()), int64_t(src.size() / 3));
}

// lookup_planes(src, lut, out, threads): out[i, ch, y, x] = lut[ch, src[i, y, x, ch]] for
// contiguous src (uint8 [N, H, W, C]), lut ([C, 256]) and out ([N, C, H, W], lut's dtype).
void lookup_planes(AnyArray src, AnyArray lut, OutArray out, int threads) {
  const bool shapes = src.ndim() == 4 && lut.ndim() == 2 && out.ndim() == 4 && lut.shape(0) == src.shape(3) &&
                      lut.shape(1) == 256 && out.shape(0) == src.shape(0) && out.shape(1) == src.shape(3) &&
                      out.shape(2) == src.shape(1) && out.shape(3) == src.shape(2);
  const LookupArrays a = lookup_arrays(
      "lookup_planes", "uint8 src [N, H, W, C], lut [C, 256] and out [N, C, H, W] of lut's dtype", shapes, src, lut, out);
  const int64_t n = int64_t(src.shape(0)), hw = int64_t(src.shape(1)) * int64_t(src.shape(2));
  const int c = int(src.shape(3));
  nb::gil_scoped_release release;
  fastdata::lookup_planes(a.src, n, hw, c, a.lut, a.itemsize, a.out, threads);
}

// mix_add(acc, src, weight, first): AugMix's mixing (collate.h) of uint8 src into float32 acc, both
// contiguous of one size.
void mix_add(nb::ndarray<float, nb::c_contig, nb::device::cpu> acc,
             nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu> src, double weight, bool first) {
  if (acc.size() != src.size()) throw nb::value_error("mix_add takes float32 acc and uint8 src of one size");
  nb::gil_scoped_release release;
  fastdata::mix_add(acc.data(), src.data(), int64_t(acc.size()), float(weight), first);
}

// mix_rolled(x, lam, threads): MixUp's blend (collate.h) of contiguous float32 x [N, ...] in place,
// with a = 1 - lam and b = lam each taken as a float, as torch's multiply by a Python number takes it.
void mix_rolled(nb::ndarray<float, nb::c_contig, nb::device::cpu> x, double lam, int threads) {
  if (x.ndim() < 1) shape_error("mix_rolled takes float32 x [N, ...]", x.ndim(), x.shape_ptr());
  const int64_t n = int64_t(x.shape(0)), per = n ? int64_t(x.size()) / n : 0;
  const float a = float(1.0 - lam), b = float(lam);
  float* data = x.data();
  nb::gil_scoped_release release;
  fastdata::mix_rolled(data, n, per, a, b, threads);
}

// mix_reversed(x, a, b, blend, threads): timm's FastCollateMixup blend (collate.h) of contiguous
// uint8 x [N, ...] in place, with float32 a, b and uint8 blend, each [N]; each weight in [0, 1].
void mix_reversed(nb::ndarray<uint8_t, nb::c_contig, nb::device::cpu> x,
                  nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> a,
                  nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> b,
                  nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> blend, int threads) {
  if (x.ndim() < 1) shape_error("mix_reversed takes uint8 x [N, ...]", x.ndim(), x.shape_ptr());
  const int64_t n = int64_t(x.shape(0)), per = n ? int64_t(x.size()) / n : 0;
  if (int64_t(a.shape(0)) != n || int64_t(b.shape(0)) != n || int64_t(blend.shape(0)) != n)
    throw nb::value_error("mix_reversed takes a, b and blend of x's N values each");
  for (int64_t i = 0; i < n; ++i) {
    if (blend.data()[i] && !(a.data()[i] >= 0.f && a.data()[i] <= 1.f && b.data()[i] >= 0.f && b.data()[i] <= 1.f))
      throw nb::value_error("mix_reversed takes weights in [0, 1]");
  }
  uint8_t* data = x.data();
  nb::gil_scoped_release release;
  fastdata::mix_reversed(data, n, per, a.data(), b.data(), blend.data(), threads);
}

// lookup_values(src, lut, out, threads): out[o, ch, i] = lut[ch, src[o, ch, i]] for contiguous
// src (uint8 [O, C, I]), lut ([C, 256]) and out ([O, C, I], lut's dtype).
void lookup_values(AnyArray src, AnyArray lut, OutArray out, int threads) {
  const bool shapes = src.ndim() == 3 && lut.ndim() == 2 && out.ndim() == 3 && lut.shape(0) == src.shape(1) &&
                      lut.shape(1) == 256 && out.shape(0) == src.shape(0) && out.shape(1) == src.shape(1) &&
                      out.shape(2) == src.shape(2);
  const LookupArrays a = lookup_arrays(
      "lookup_values", "uint8 src [O, C, I], lut [C, 256] and out [O, C, I] of lut's dtype", shapes, src, lut, out);
  const int64_t outer = int64_t(src.shape(0)), inner = int64_t(src.shape(2));
  const int c = int(src.shape(1));
  nb::gil_scoped_release release;
  fastdata::lookup_values(a.src, outer, c, inner, a.lut, a.itemsize, a.out, threads);
}

// read_files(paths, threads) -> [bytes or str]: each file's bytes (at most the size fstat gave
// when it was opened); where it could not be read, the cause: as Python's OSError.strerror
// gives it ("No such file or directory", "Is a directory", ...; "embedded null byte" for a path
// no system call takes), or "not a regular file (a FIFO)" (a character device, a block device,
// a socket) for a file that is not read at all (see open_files). The opens and reads run on up
// to `threads` threads with the GIL released; the bytes objects are made, empty, between the
// two, and filled in place before anyone else sees them. With `budget` >= 0, the files are read
// in order while their sizes (as opened) add up to at most `budget` bytes, the first always:
// from the first that would go past it on, each is None, closed unread, for a later call (so
// that a batch of large files is held a part at a time, not whole).
nb::list read_files(nb::sequence paths, int threads, int64_t budget) {
  const size_t n = nb::len(paths);
  std::vector<nb::object> names(n);  // each path as bytes in the file system's encoding
  std::vector<const char*> raw(n, "");
  std::vector<const char*> causes(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    PyObject* encoded = nullptr;
    if (!PyUnicode_FSConverter(nb::object(paths[i]).ptr(), &encoded)) {
      if (!PyErr_ExceptionMatches(PyExc_ValueError)) throw nb::python_error();
      PyErr_Clear();  // a NUL inside the path, as open() would say
      causes[i] = "embedded null byte";
      continue;
    }
    names[i] = nb::steal(encoded);
    raw[i] = PyBytes_AS_STRING(encoded);
  }
  std::vector<fastdata::OpenFile> files;
  {
    nb::gil_scoped_release release;
    fastdata::open_files(raw, &files, threads);
  }
  size_t taken = n;  // the files from this one on are left for a later call
  if (budget >= 0) {
    int64_t total = 0;
    for (size_t i = 0; i < n && taken == n; ++i) {
      if (files[i].fd < 0) continue;  // a cause: no bytes
      if (total > 0 && files[i].size > budget - total) taken = i;
      total += files[i].size;
    }
    for (size_t i = taken; i < n; ++i) {
      if (files[i].fd >= 0) ::close(files[i].fd);
      files[i].fd = -1;
    }
  }
  std::vector<nb::object> datas(n);
  std::vector<uint8_t*> bufs(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (files[i].fd < 0) continue;  // not opened, or closed unread: a cause
    PyObject* b = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(files[i].size));
    if (b == nullptr) {
      for (fastdata::OpenFile& f : files) {
        if (f.fd >= 0) ::close(f.fd);
      }
      throw nb::python_error();
    }
    datas[i] = nb::steal(b);
    bufs[i] = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(b));
  }
  std::vector<int64_t> got;
  {
    nb::gil_scoped_release release;
    fastdata::read_files(&files, bufs, &got, threads);
  }
  nb::list result;
  for (size_t i = 0; i < n; ++i) {
    const fastdata::OpenFile& f = files[i];
    if (i >= taken) {
      result.append(nb::none());
    } else if (causes[i] != nullptr) {
      result.append(nb::str(causes[i]));
    } else if (f.error != 0) {
      result.append(nb::str(std::strerror(f.error)));
    } else if (f.refused != nullptr) {
      result.append(nb::str(f.refused));
    } else if (f.too_large) {
      result.append(nb::str(("too large: " + std::to_string(f.size) + " bytes, over the " +
                             std::to_string(fastdata::kMaxFileBytes) + " an image file may have")
                                .c_str()));
    } else {
      if (got[i] < f.size) {  // the file shrank since it was sized: its bytes as read
        PyObject* b = datas[i].release().ptr();
        if (_PyBytes_Resize(&b, Py_ssize_t(got[i])) != 0) throw nb::python_error();
        datas[i] = nb::steal(b);
      }
      result.append(datas[i]);
    }
  }
  return result;
}

// The bytes of each bytes-like object (bytes, bytearray, memoryview, contiguous numpy array),
// held through the buffer protocol so they stay put while the GIL is released. Release needs
// the GIL: declare it before any gil_scoped_release, so it is destroyed after.
class HeldBytes {
 public:
  explicit HeldBytes(size_t n) { views_.reserve(n); }
  ~HeldBytes() {
    for (Py_buffer& v : views_) PyBuffer_Release(&v);
  }
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;

  fastdata::ByteSpan add(nb::handle obj, const char* what) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw nb::type_error((std::string(what) +
                            " should be bytes-like (bytes, bytearray, memoryview or a "
                            "contiguous uint8 array), but got " +
                            nb::type_name(obj.type()).c_str())
                               .c_str());
    }
    views_.push_back(view);
    return {static_cast<const uint8_t*>(view.buf), size_t(view.len)};
  }

  // The spans of datas[0 .. n), each named "datas[i]" in an error.
  std::vector<fastdata::ByteSpan> add_all(nb::sequence datas, size_t n) {
    std::vector<fastdata::ByteSpan> spans;
    spans.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      spans.push_back(add(datas[i], ("datas[" + std::to_string(i) + "]").c_str()));
    }
    return spans;
  }

 private:
  std::vector<Py_buffer> views_;
};

nb::str decode_name(const uint8_t* p, size_t n) {
  PyObject* s = PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(p), Py_ssize_t(n),
                                     "surrogateescape");
  if (s == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

// tar_plain_members(data, start, pos, stop) -> ([(offset, name, data, size)], position): the
// plain regular members from shard byte pos on, data holding the shard's bytes from `start`;
// names decoded as tarfile does (UTF-8, surrogateescape), "prefix/name" where the USTAR prefix
// is set. See tar.h.
nb::tuple tar_plain_members(nb::handle data, int64_t start, int64_t pos, int64_t stop) {
  HeldBytes held(1);
  const fastdata::ByteSpan src = held.add(data, "data");
  std::vector<fastdata::TarMember> found;
  const int64_t at = fastdata::walk_plain_tar(src, start, pos, stop, &found);
  nb::list members;
  for (const fastdata::TarMember& m : found) {
    nb::str name = decode_name(m.header, m.name_len);
    if (m.prefix_len) {
      PyObject* whole = PyUnicode_FromFormat("%U/%U", decode_name(m.header + 345, m.prefix_len).ptr(),
                                             name.ptr());
      if (whole == nullptr) throw nb::python_error();
      name = nb::steal<nb::str>(whole);
    }
    members.append(nb::make_tuple(m.offset, name, m.data, m.size));
  }
  return nb::make_tuple(members, at);
}

#ifdef FASTDATA_HAVE_JPEG
// jpeg_info(data) -> (width, height, components), from the header alone; ValueError with
// libjpeg's message for anything it cannot parse.
nb::tuple jpeg_info(nb::handle data) {
  HeldBytes held(1);
  const fastdata::ByteSpan src = held.add(data, "data");
  fastdata::JpegInfo info;
  std::string err = fastdata::jpeg_info(src, &info);
  if (!err.empty()) throw nb::value_error(err.c_str());
  return nb::make_tuple(info.width, info.height, info.components);
}

// jpeg_info_batch(datas) -> [(width, height, components) or None], GIL released.
nb::list jpeg_info_batch(nb::sequence datas) {
  const size_t n = nb::len(datas);
  HeldBytes held(n);
  const std::vector<fastdata::ByteSpan> srcs = held.add_all(datas, n);
  std::vector<fastdata::JpegInfo> infos(n);
  std::vector<char> ok(n);
  {
    nb::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) ok[i] = fastdata::jpeg_info(srcs[i], &infos[i]).empty();
  }
  nb::list result;
  for (size_t i = 0; i < n; ++i) {
    if (ok[i]) {
      result.append(nb::make_tuple(infos[i].width, infos[i].height, infos[i].components));
    } else {
      result.append(nb::none());
    }
  }
  return result;
}

// inspect_batch(datas, jpeg_headers, threads) -> [(cause or None, kind, width, height)]:
// check_structure for each (kind 0 other, 1 JPEG, 2 PNG), and with jpeg_headers libjpeg's header
// parse of each whole JPEG too; on up to `threads` threads, GIL released.
nb::list inspect_batch(nb::sequence datas, bool jpeg_headers, int threads) {
  const size_t n = nb::len(datas);
  HeldBytes held(n);
  const std::vector<fastdata::ByteSpan> srcs = held.add_all(datas, n);
  std::vector<fastdata::ImageStructure> found(n);
  std::vector<std::string> causes(n);
  {
    nb::gil_scoped_release release;
    fastdata::parallel_for(int64_t(n), threads, [&](int64_t k) {
      const size_t i = size_t(k);
      try {
        causes[i] = fastdata::check_structure(srcs[i], &found[i]);
        if (jpeg_headers && causes[i].empty() && found[i].kind == fastdata::kImageJpeg) {
          fastdata::JpegInfo info;
          const std::string why = fastdata::jpeg_info(srcs[i], &info);
          if (!why.empty()) causes[i] = "corrupt JPEG header (" + why + ")";
        }
      } catch (const std::bad_alloc&) {
        causes[i] = "out of memory";
      }
    });
  }
  nb::list result;
  for (size_t i = 0; i < n; ++i) {
    nb::object cause = nb::none();
    if (!causes[i].empty()) cause = nb::str(causes[i].c_str(), causes[i].size());
    result.append(nb::make_tuple(cause, found[i].kind, found[i].width, found[i].height));
  }
  return result;
}

using CropArray = nb::ndarray<const double, nb::ndim<2>, nb::device::cpu>;
using FlipArray = nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu>;
using ImageBatch = nb::ndarray<uint8_t, nb::ndim<4>, nb::device::cpu>;
using SizeArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::device::cpu>;

// Whether `a` is [n] of uint8 or bool.
bool is_byte_vector(const FlipArray& a, size_t n) {
  const nb::dlpack::dtype dt = a.dtype();
  return a.shape(0) == n && dt.bits == 8 && dt.lanes == 1 &&
         (dt.code == uint8_t(nb::dlpack::dtype_code::UInt) ||
          dt.code == uint8_t(nb::dlpack::dtype_code::Bool));
}

// decode_crop_resize(datas, crops, flips, out, threads, whole, index, resample, crop_first,
//                    vertical_first, bicubic, resized, weights) -> [None or error]:
// out[i] = the crop (x, y, w, h) of JPEG datas[i], resized to out's H x W (Pillow's bilinear or bicubic),
// mirrored where flips[i]. out is [N, 3, H, W] uint8 with any strides; GIL released while
// decoding. whole: None (every file entropy-decoded to its end) or uint8/bool [N], 0 where the
// decode may stop at the window's last row. index: entropy.cpp's decoder and its checkpoints
// (else libjpeg's entropy decoder). vertical_first: None or uint8/bool [N], nonzero where the
// vertical pass comes first. bicubic: None (every sample `resample`) or uint8/bool [N], nonzero
// where the sample is resized bicubic, else bilinear. resized: None or int64 [N, 2], (w, h) > 0
// where the whole image is resized to that size and the crop is a window of it (decode.h).
// weights: "pillow" (classic Pillow's) or "pillow-simd" (Pillow-SIMD's: resample.h).
nb::list decode_crop_resize(nb::sequence datas, CropArray crops, FlipArray flips, ImageBatch out,
                            int threads, std::optional<FlipArray> whole, bool index,
                            const std::string& resample, bool crop_first,
                            std::optional<FlipArray> vertical_first, std::optional<FlipArray> bicubic,
                            std::optional<SizeArray> resized, const std::string& weights) {
  if (resample != "bilinear" && resample != "bicubic") {
    throw nb::value_error(("resample should be 'bilinear' or 'bicubic', not '" + resample + "'").c_str());
  }
  if (weights != "pillow" && weights != "pillow-simd") {
    throw nb::value_error(("weights should be 'pillow' or 'pillow-simd', not '" + weights + "'").c_str());
  }
  const size_t n = nb::len(datas);
  if (crops.shape(0) != n || crops.shape(1) != 4) {
    shape_error("crops should have shape [" + std::to_string(n) + ", 4]", crops.ndim(), crops.shape_ptr());
  }
  if (!is_byte_vector(flips, n)) {
    shape_error("flips should be uint8 or bool with shape [" + std::to_string(n) + "]", flips.ndim(),
                flips.shape_ptr());
  }
  if (whole.has_value() && !is_byte_vector(*whole, n)) {
    shape_error("whole should be uint8 or bool with shape [" + std::to_string(n) + "]", whole->ndim(),
                whole->shape_ptr());
  }
  if (vertical_first.has_value() && !is_byte_vector(*vertical_first, n)) {
    shape_error("vertical_first should be uint8 or bool with shape [" + std::to_string(n) + "]",
                vertical_first->ndim(), vertical_first->shape_ptr());
  }
  if (bicubic.has_value() && !is_byte_vector(*bicubic, n)) {
    shape_error("bicubic should be uint8 or bool with shape [" + std::to_string(n) + "]", bicubic->ndim(),
                bicubic->shape_ptr());
  }
  if (resized.has_value() && (resized->shape(0) != n || resized->shape(1) != 2)) {
    shape_error("resized should have shape [" + std::to_string(n) + ", 2]", resized->ndim(), resized->shape_ptr());
  }
  if (out.shape(0) != n || out.shape(1) != 3 || out.shape(2) < 1 || out.shape(3) < 1 ||
      out.shape(2) > (1 << 20) || out.shape(3) > (1 << 20)) {
    shape_error("out should have shape [" + std::to_string(n) + ", 3, H, W]", out.ndim(), out.shape_ptr());
  }
  HeldBytes held(n);
  const std::vector<fastdata::ByteSpan> srcs = held.add_all(datas, n);
  // Copied out of their arrays, whatever their strides.
  std::vector<double> crop_values(4 * n);
  std::vector<uint8_t> flip_values(n), whole_values(whole.has_value() ? n : 0),
      vertical_values(vertical_first.has_value() ? n : 0), bicubic_values(bicubic.has_value() ? n : 0);
  const double* c = crops.data();
  const uint8_t* f = static_cast<const uint8_t*>(flips.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < 4; ++j) crop_values[4 * i + j] = c[i * crops.stride(0) + j * crops.stride(1)];
    flip_values[i] = f[i * flips.stride(0)] != 0;
  }
  if (whole.has_value()) {
    const uint8_t* w = static_cast<const uint8_t*>(whole->data());
    for (size_t i = 0; i < n; ++i) whole_values[i] = w[i * whole->stride(0)] != 0;
  }
  if (vertical_first.has_value()) {
    const uint8_t* v = static_cast<const uint8_t*>(vertical_first->data());
    for (size_t i = 0; i < n; ++i) vertical_values[i] = v[i * vertical_first->stride(0)] != 0;
  }
  if (bicubic.has_value()) {
    const uint8_t* b = static_cast<const uint8_t*>(bicubic->data());
    for (size_t i = 0; i < n; ++i) bicubic_values[i] = b[i * bicubic->stride(0)] != 0;
  }
  std::vector<int64_t> resized_values(resized.has_value() ? 2 * n : 0);
  if (resized.has_value()) {
    const int64_t* r = resized->data();
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < 2; ++j) resized_values[2 * i + j] = r[i * resized->stride(0) + j * resized->stride(1)];
    }
  }
  const fastdata::OutView view{out.data(),         out.stride(0),      out.stride(1),
                               out.stride(2),      out.stride(3),      int(out.shape(2)),
                               int(out.shape(3))};
  std::vector<std::string> errors;
  {
    nb::gil_scoped_release release;
    fastdata::decode_crop_resize(srcs, crop_values.data(), flip_values.data(), view, threads,
                                 &errors, whole.has_value() ? whole_values.data() : nullptr, index,
                                 {resample == "bicubic" ? fastdata::Filter::kBicubic : fastdata::Filter::kBilinear,
                                  crop_first, false, 0, 0, weights == "pillow-simd"},
                                 vertical_first.has_value() ? vertical_values.data() : nullptr,
                                 bicubic.has_value() ? bicubic_values.data() : nullptr,
                                 resized.has_value() ? resized_values.data() : nullptr);
  }
  nb::list result;
  for (const std::string& e : errors) {
    if (e.empty()) {
      result.append(nb::none());
    } else {
      result.append(nb::str(e.c_str(), e.size()));
    }
  }
  return result;
}
#endif  // FASTDATA_HAVE_JPEG

}  // namespace

// stamps(datas, k0, k1, threads) -> bytes: for each bytes-like datas[i], 8 bytes (native order)
// of the keyed hash of its bytes under the key (k0, k1), its top bit cleared and its lowest
// set, so never 0 (a record's "not checked"); hashed on up to `threads` threads, GIL released.
nb::bytes stamps(nb::sequence datas, uint64_t k0, uint64_t k1, int threads) {
  const size_t n = nb::len(datas);
  HeldBytes held(n);
  const std::vector<fastdata::ByteSpan> spans = held.add_all(datas, n);
  std::vector<uint64_t> out(n);
  int64_t total = 0;
  for (const fastdata::ByteSpan& b : spans) total += int64_t(b.size);
  {
    nb::gil_scoped_release release;
    fastdata::parallel_for(int64_t(n), fastdata::threads_for_bytes(total, threads), [&](int64_t i) {
      const fastdata::ByteSpan& b = spans[size_t(i)];
      out[size_t(i)] = (fastdata::keyed_hash(k0, k1, b.data, b.size) >> 1) | 1;
    });
  }
  return nb::bytes(reinterpret_cast<const char*>(out.data()), n * sizeof(uint64_t));
}

extern "C" int fastdata_guard_fork(void);  // forksafe.c

NB_MODULE(_native, m) {
  m.doc() = "fastdata's native core: collation on raw buffers, GIL released.";
  m.def("collate", &collate, nb::arg("samples"), nb::arg("out"), nb::arg("threads") = 1,
        "Copy samples[i] into out[i] for every i with up to `threads` threads, GIL released.");
  m.def("collate_ptrs", &collate_ptrs, nb::arg("addresses"), nb::arg("strides"), nb::arg("out"),
        nb::arg("threads") = 1, "collate() for sources given as data addresses and element strides.");
  m.def("hue_shift", &hue_shift, nb::arg("src"), nb::arg("out"), nb::arg("shift"),
        "Pillow's hue shift of uint8 RGB pixels [..., 3] (RGB to HSV, hue + shift modulo 256, back), "
        "each pixel as Pillow's conversions give it; GIL released.");
  m.def("enhance", &enhance, nb::arg("src"), nb::arg("out"), nb::arg("kind"), nb::arg("factor"),
        nb::arg("luma") = std::array<int, 4>{19595, 38470, 7471, 16}, nb::arg("lanes") = 0,
        "Pillow's ImageEnhance Brightness (kind 0), Contrast (1), Color (2) or Sharpness (3: of an image "
        "[H, W, 3]) of uint8 RGB pixels [..., 3], "
        "enhance(factor), each value as Pillow's blend gives it, \"L\" with the weights luma = (r, g, b, "
        "shift), with lanes > 0 Pillow's own for the last W % lanes pixels of each row (Pillow-SIMD's); "
        "GIL released.");
  m.def("tensor_enhance", &tensor_enhance, nb::arg("src"), nb::arg("out"), nb::arg("kind"), nb::arg("factor"),
        "torchvision's adjust_brightness (kind 0), adjust_contrast (1), adjust_saturation (2) or adjust_sharpness (3) "
        "tensor kernel (transforms.functional's) of a uint8 image [C, H, W] into out, each value as torch's float32 "
        "operations give it; GIL released.");
  m.def("affine", &affine, nb::arg("src"), nb::arg("out"), nb::arg("data"), nb::arg("resample"), nb::arg("fill"),
        "Pillow's Image.transform(size, AFFINE, data, resample, fillcolor=fill) of uint8 pixels [H, W, C] (C 1 or 3) "
        "into out [H2, W2, C], each pixel as Pillow's gives it (resample 0 nearest, 2 bilinear, 3 bicubic); "
        "GIL released.");
  m.def("resize_images", &resize_images, nb::arg("src"), nb::arg("out"), nb::arg("boxes"), nb::arg("resample"),
        nb::arg("vertical_first").none(), nb::arg("weights"), nb::arg("threads") = 1,
        "Pillow's resize (bilinear or bicubic, classic or Pillow-SIMD weights) of each box (x0, y0, x1, y1) cut from "
        "uint8 images [N, H, W, C] (C 1 or 3) into out [N, OH, OW, C], each pixel as Pillow's; GIL released.");
  m.def("gaussian_blur", &gaussian_blur, nb::arg("src"), nb::arg("out"), nb::arg("xradius"), nb::arg("yradius"),
        "Pillow's Image.gaussian_blur((xradius, yradius)) (ImageFilter.GaussianBlur's) of uint8 pixels [H, W, C] "
        "(C 1 or 3) into out, each value as Pillow's BoxBlur.c gives it; False, out untouched, for a radius past "
        "what Pillow's sums hold or a blur along one axis alone; GIL released.");
  m.def("convert_hsv", &convert_hsv, nb::arg("src"), nb::arg("out"), nb::arg("to_hsv"),
        "Pillow's RGB to HSV (to_hsv) or HSV to RGB conversion of uint8 pixels [..., 3]; GIL released.");
  m.def("lookup_planes", &lookup_planes, nb::arg("src"), nb::arg("lut"), nb::arg("out"), nb::arg("threads") = 1,
        "out[i, c, y, x] = lut[c, src[i, y, x, c]] for contiguous uint8 src [N, H, W, C], lut [C, 256], "
        "out [N, C, H, W] of lut's dtype; GIL released.");
  m.def("mix_add", &mix_add, nb::arg("acc").noconvert(), nb::arg("src").noconvert(), nb::arg("weight"),
        nb::arg("first"),
        "AugMix's mixing: acc = float(weight) * src (first) or acc + float(weight) * src, for contiguous float32 acc "
        "and uint8 src of one size, each product and sum as torch's mul and add_ round them; GIL released.");
  m.def("mix_rolled", &mix_rolled, nb::arg("x").noconvert(), nb::arg("lam"), nb::arg("threads") = 1,
        "MixUp's blend in place: x[i] = x[i-1] * float(1 - lam) + x[i] * float(lam) for contiguous float32 x "
        "[N, ...] (x[-1] the last sample as it was), each value as torchvision's roll, mul_ and add_ give it; "
        "GIL released.");
  m.def("mix_reversed", &mix_reversed, nb::arg("x").noconvert(), nb::arg("a").noconvert(), nb::arg("b").noconvert(),
        nb::arg("blend").noconvert(), nb::arg("threads") = 1,
        "timm's FastCollateMixup blend in place: for each pair (i, j = N-1-i), x[i] = rint(x[i] * a[i] + x[j] * b[i]) "
        "where blend[i], x[j] = rint(x[j] * a[j] + x[i] * b[j]) where blend[j], from the values as they were, for "
        "contiguous uint8 x [N, ...], float32 a, b, uint8 blend [N], weights in [0, 1]; each value as torch's float "
        "mul, add and round give it; GIL released.");
  m.def("lookup_values", &lookup_values, nb::arg("src"), nb::arg("lut"), nb::arg("out"), nb::arg("threads") = 1,
        "out[o, c, i] = lut[c, src[o, c, i]] for contiguous uint8 src [O, C, I], lut [C, 256], "
        "out [O, C, I] of lut's dtype; GIL released.");
  m.def("stamps", &stamps, nb::arg("datas"), nb::arg("k0"), nb::arg("k1"), nb::arg("threads") = 1,
        "For each bytes-like object, 8 bytes (native order): its keyed hash (SipHash-1-3) under "
        "(k0, k1), top bit clear, lowest set; GIL released.");
  m.def("read_files", &read_files, nb::arg("paths"), nb::arg("threads") = 1, nb::arg("budget") = -1,
        "Each file's bytes (at most its size when opened), or the cause where it cannot be read "
        "(OSError's strerror, or 'not a regular file (a FIFO)' and the like); opened and read on up "
        "to `threads` threads, GIL released. With budget >= 0: read in order while the sizes add "
        "up to at most budget bytes (the first always), None for the rest.");
  m.def("tar_plain_members", &tar_plain_members, nb::arg("data"), nb::arg("start"), nb::arg("pos"),
        nb::arg("stop"),
        "([(offset, name, data, size)], position): the tar's plain regular-file members from byte "
        "pos up to stop, data holding its bytes from byte start on, up to the first header that "
        "is anything else (or not wholly in data), whose position is returned.");
  m.def("guard_fork", &fastdata_guard_fork,
        "Makes a fork in this process safe from CPython gh-112275 (a child forked while a native thread "
        "creates its thread state waits forever inside os.fork()) where the interpreter has it: 1 when "
        "guarded, 0 when this interpreter needs nothing, -1 when its runtime layout did not check.");
#ifdef FASTDATA_HAVE_JPEG
  m.attr("HAVE_JPEG") = true;
  m.def("jpeg_info", &jpeg_info, nb::arg("data"),
        "(width, height, components) from a JPEG's header; ValueError if it cannot be parsed.");
  m.def("jpeg_info_batch", &jpeg_info_batch, nb::arg("datas"),
        "jpeg_info for each of datas, None where it cannot be parsed; GIL released.");
  m.def("inspect_batch", &inspect_batch, nb::arg("datas"), nb::arg("jpeg_headers") = true,
        nb::arg("threads") = 1,
        "(cause or None, kind, width, height) of each of datas from its JPEG/PNG structure (kind "
        "0 other, 1 JPEG, 2 PNG), with libjpeg's header parse of whole JPEGs when jpeg_headers; "
        "on up to `threads` threads, GIL released.");
  m.attr("MAX_PIXELS") = fastdata::kMaxImagePixels;
  m.attr("MAX_SCANS") = fastdata::kMaxScans;
  m.attr("MAX_SCAN_PIXELS") = fastdata::kMaxScanPixels;
  m.attr("MAX_PNG_CHUNKS") = fastdata::kMaxPngChunks;
  m.attr("MAX_PNG_TEXTS") = fastdata::kMaxPngTexts;
  m.attr("MAX_JPEG_MARKERS") = fastdata::kMaxJpegMarkers;
  m.attr("MAX_JPEG_FILL") = fastdata::kMaxJpegFill;
  m.attr("MAX_FILE_BYTES") = fastdata::kMaxFileBytes;
  m.def("decode_crop_resize", &decode_crop_resize, nb::arg("datas"), nb::arg("crops"),
        nb::arg("flips"), nb::arg("out"), nb::arg("threads") = 1,
        nb::arg("whole").none() = nb::none(), nb::arg("index") = true, nb::arg("resample") = "bilinear",
        nb::arg("crop_first") = false, nb::arg("vertical_first").none() = nb::none(),
        nb::arg("bicubic").none() = nb::none(), nb::arg("resized").none() = nb::none(),
        nb::arg("weights") = "pillow",
        "Decode crop (x, y, w, h) of each JPEG, resize it into out[i] ([N, 3, H, W] uint8, any "
        "strides) as Pillow's resize with that box and filter ('bilinear' or 'bicubic'; bicubic where "
        "bicubic[i], else bilinear, where that array is given) does "
        "(crop_first: its resize of the crop cut out; the vertical pass first where "
        "vertical_first[i]; where resized[i] is a size, the window (x, y) of out's size of the "
        "whole image resized to it), mirrored where flips[i]; a "
        "baseline JPEG's rows below the window are entropy-decoded too unless whole[i] is 0; "
        "weights 'pillow' (classic Pillow's 22-bit) or 'pillow-simd' (Pillow-SIMD's 16-bit); "
        "returns None or an error message per sample. GIL released.");
  m.def("open_index", &fastdata::open_index, nb::arg("path"), nb::arg("slots"), nb::arg("arena"),
        nb::arg("max_checkpoints"),
        "Make the index file at path (or, for '', an anonymous one) this process's checkpoint "
        "index; returns '' or why the file was not used (an anonymous index is used instead).");
  m.def("index_stats", [] {
    const fastdata::IndexStats s = fastdata::current_index().stats();
    nb::dict d;
    d["path"] = s.path;
    d["files"] = s.files;
    d["used"] = s.used;
    d["arena"] = s.arena;
    d["slots"] = s.slots;
    d["max_checkpoints"] = s.max_checkpoints;
    return d;
  }, "The checkpoint index's file ('' when anonymous), files indexed, arena bytes used and "
     "held, slots, and the most checkpoints a file.");
  m.def("decoder_scratch_bytes", &fastdata::decoder_scratch_bytes,
        "Bytes the calling thread's decoder keeps between decodes.");
#else
  m.attr("HAVE_JPEG") = false;  // built without libjpeg-turbo: images decode with Pillow
#endif
}
