// libFuzzer target for the native JPEG path (csrc/decode.cpp, entropy.cpp): check_structure,
// jpeg_info, then decode_crop_resize with a crop, flip, output size and output layout the input
// chooses.
//
// Input: 8 parameter bytes, then the JPEG (the seed corpus is real JPEGs behind a header):
//   [0] out width - 1 (mod 64)    [1] out height - 1 (mod 64)
//   [2..5] crop x, y, w, h as fractions of the image (x/255 of the room left, ...)
//   [6] bit 0 flip; bits 1-2 layout: 0 NCHW, 1 NHWC, 2 padded HWC (4 bytes a pixel, padded
//       rows and samples), 3 NCHW with its rows in reverse (a negative row stride, as a numpy
//       view out[:, :, ::-1] has); bit 3 a batch of two (the sample again, mirrored the other
//       way) on two threads; bit 4 the first sample stops at its window's last row (whole = 0);
//       bit 5 the bicubic filter (else bilinear), bit 6 the window cut out before the resize
//       (crop_first), bit 7 the vertical pass first (vertical_first), in every decode of the input
//   [7] edge nudge: crop value k moves by {0, +1, -1, +2}[(b >> 2k) & 3], so that crops one
//       pixel past the image (which must be refused) come up as often as crops flush with it
// Each input also decodes a window of the whole image resized (torchvision's Resize, then a
// crop): to (out w + [4] % 64, out h + [5] % 64), at ([2], [3]) as fractions of the room left,
// nudged by [7]'s first two fields. It must decode where the reference does and its window lies
// in the resize, fail otherwise with a message and its output untouched, keep grayscale grey,
// and give libjpeg's Huffman decoder's pixels; with Pillow-SIMD's weights, decode as it does.
// tests/robustness/test_fuzz.py (`decode_case`) reads the same layout to replay inputs through Python.
//
// What fails the run, beside ASan/UBSan reports and crashes:
// - a sample that fails without a message, or whose output bytes were touched anyway;
// - any byte outside the output view written (the buffer holds exactly the view's span, padding
//   included, so ASan catches writes past it and the padding is checked here);
// - a decode that differs from the same crop decoded into a plain NCHW buffer (mirrored where
//   flipped): layout and flip only move bytes, they never change them;
// - the same crop decoding in one call and failing in another (on another thread, or after
//   other images: a decoder must carry nothing from one image to the next), except that a
//   decode stopping at the window's last row may pass where the whole decode fails (corrupt
//   data below the window), never the other way;
// - a decode of bytes that check_structure or jpeg_info refused;
// - a grayscale JPEG whose output is not R = G = B;
// - a decode from the entropy decoder's checkpoints (the same bytes again) that differs from the
//   decode that made them;
// - the differential check: the same crop decoded by libjpeg's own Huffman decoder (index false)
//   with other pixels, or failing where the checkpoint decoder decoded, or decoding where it
//   failed for any reason but the two where it is stricter by design (entropy.h).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../decode.h"
#include "fuzz_input.h"

namespace {

using fastdata::ByteSpan;
using fastdata::OutView;

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "decode_fuzzer: %s %s\n", what, detail.c_str());
  std::abort();
}

constexpr uint8_t kSentinel = 0xA5;
constexpr int kNudge[4] = {0, 1, -1, 2};  // a zero byte (input run out) nudges nothing
// Larger images decode slowly and say nothing new about the crop/resize arithmetic; libjpeg's
// own allocation for a hostile header (a progressive image buffers all its coefficients) is
// bounded by decode.cpp's pixel limit, not worth an out-of-memory report here.
constexpr int64_t kMaxFuzzPixels = int64_t(1) << 22;

// A uint8 [n, 3, h, w] view with the layout's strides over a buffer that holds exactly its span.
struct Out {
  std::vector<uint8_t> buf;
  OutView view{};
  int64_t origin = 0;  // offset of element (0, 0, 0, 0) in buf
  int n = 0;

  Out(int n_, int h, int w, int layout) : n(n_) {
    int64_t sb, sc, sh, sw;
    switch (layout) {
      case 1: sc = 1, sw = 3, sh = int64_t(3) * w, sb = int64_t(3) * h * w; break;
      case 2: sc = 1, sw = 4, sh = int64_t(4) * w + 5, sb = sh * h + 7; break;
      case 3: sw = 1, sh = -int64_t(w), sc = int64_t(h) * w, sb = int64_t(3) * h * w; break;
      default: sw = 1, sh = w, sc = int64_t(h) * w, sb = int64_t(3) * h * w; break;
    }
    int64_t lo = 0, hi = 0;
    const int64_t extent[4] = {n, 3, h, w}, stride[4] = {sb, sc, sh, sw};
    for (int d = 0; d < 4; ++d) {
      const int64_t reach = (extent[d] - 1) * stride[d];
      (reach < 0 ? lo : hi) += reach;
    }
    buf.assign(size_t(hi - lo + 1), kSentinel);
    origin = -lo;
    view = {buf.data() + origin, sb, sc, sh, sw, h, w};
  }
  int64_t offset(int i, int c, int y, int x) const {
    return origin + i * view.batch_stride + c * view.stride_c + y * view.stride_h +
           x * view.stride_w;
  }
  uint8_t at(int i, int c, int y, int x) const { return buf[size_t(offset(i, c, y, x))]; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fastdata_fuzz::Cursor in{data, size};
  const int out_w = 1 + in.byte() % 64, out_h = 1 + in.byte() % 64;
  const uint8_t fx = in.byte(), fy = in.byte(), fw = in.byte(), fh = in.byte();
  const uint8_t flags = in.byte(), nudge = in.byte();
  const ByteSpan jpeg{size > 8 ? data + 8 : data, size > 8 ? size - 8 : 0};
  const bool flip = flags & 1, pair = flags & 8, partial = flags & 16;
  const fastdata::Resize filter{flags & 32 ? fastdata::Filter::kBicubic : fastdata::Filter::kBilinear,
                                bool(flags & 64), bool(flags & 128)};
  const int layout = (flags >> 1) & 3;

  // The container walk (the decode runs it too; here also on PNGs, which the decode refuses).
  fastdata::ImageStructure structure;
  const std::string structure_error = fastdata::check_structure(jpeg, &structure);
  if (structure_error.empty() && structure.kind != fastdata::kImageOther &&
      (structure.width < 1 || structure.height < 1)) {
    fail("check_structure passed an image with no size");
  }

  fastdata::JpegInfo info;
  const std::string info_error = fastdata::jpeg_info(jpeg, &info);
  int64_t W = 1, H = 1;
  if (info_error.empty()) {
    W = info.width, H = info.height;
    if (W < 1 || H < 1 || info.components < 1) fail("jpeg_info accepted a degenerate image");
    if (W * H > kMaxFuzzPixels) return 0;
  }
  int64_t crop64[4];
  crop64[2] = 1 + fw * (W - 1) / 255;
  crop64[3] = 1 + fh * (H - 1) / 255;
  crop64[0] = fx * (W - crop64[2]) / 255;
  crop64[1] = fy * (H - crop64[3]) / 255;
  for (int k = 0; k < 4; ++k) crop64[k] += kNudge[(nudge >> (2 * k)) & 3];
  const double crop[8] = {double(crop64[0]), double(crop64[1]), double(crop64[2]), double(crop64[3]),
                          double(crop64[0]), double(crop64[1]), double(crop64[2]), double(crop64[3])};

  const int n = pair ? 2 : 1;
  const uint8_t flips[2] = {uint8_t(flip), uint8_t(!flip)};
  const uint8_t whole[2] = {uint8_t(!partial), 1};
  const std::vector<ByteSpan> srcs(size_t(n), jpeg);
  Out out(n, out_h, out_w, layout);
  std::vector<std::string> errors;
  fastdata::decode_crop_resize(srcs, crop, flips, out.view, n, &errors, whole, true, filter);
  if (errors.size() != size_t(n)) fail("wrong number of results");

  // The reference: the same crop, one sample, plain NCHW, not flipped.
  Out ref(1, out_h, out_w, 0);
  std::vector<std::string> ref_errors;
  const uint8_t no_flip = 0;
  fastdata::decode_crop_resize({jpeg}, crop, &no_flip, ref.view, 1, &ref_errors, nullptr, true, filter);
  const bool ok = ref_errors[0].empty();
  if (!info_error.empty() && ok) fail("decoded a JPEG whose header jpeg_info refused:", info_error);
  if (ok && (!structure_error.empty() || structure.kind != fastdata::kImageJpeg)) {
    fail("decoded a file check_structure refused:", structure_error);
  }

  std::vector<char> in_view(out.buf.size(), 0);
  for (int i = 0; i < n; ++i) {
    const std::string& e = errors[size_t(i)];
    const bool got = e.empty();
    if (whole[i] ? got != ok : ok && !got) {
      fail("the same crop decoded in one call and failed in another:", e + " / " + ref_errors[0]);
    }
    if (got && (!info_error.empty() || !structure_error.empty() ||
                structure.kind != fastdata::kImageJpeg)) {
      fail("decoded (to the window's end) a file check_structure or jpeg_info refused:", e);
    }
    const bool mirrored = flips[i] != 0;
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < out_h; ++y) {
        for (int x = 0; x < out_w; ++x) {
          in_view[size_t(out.offset(i, c, y, x))] = 1;
          const uint8_t v = out.at(i, c, y, x);
          if (!got) {
            if (v != kSentinel) fail("a failed sample's output was written:", e);
            continue;
          }
          if (info.components == 1 && v != out.at(i, 0, y, x)) {
            fail("grayscale came out in color");
          }
          if (!ok) continue;  // decoded to the window's end only: no whole decode to compare
          const uint8_t want = ref.at(0, c, y, mirrored ? out_w - 1 - x : x);
          if (v != want) fail("layout, flip or the decode's end changed a pixel value");
        }
      }
    }
    if (!ok && whole[i] && e.empty()) fail("a failed sample has no message");
  }
  for (size_t k = 0; k < out.buf.size(); ++k) {
    if (!in_view[k] && out.buf[k] != kSentinel) fail("a byte outside the output view was written");
  }

  // The differential check: libjpeg's own Huffman decoder (index false) on the same crop. The
  // same pixels where both decode; where one fails, so does the other, except where entropy.cpp
  // is stricter (entropy.h): a bad Huffman code, which libjpeg-turbo's fast path reads as symbol
  // 0 without a warning.
  {
    Out lib(1, out_h, out_w, 0);
    std::vector<std::string> lib_errors;
    fastdata::decode_crop_resize({jpeg}, crop, &no_flip, lib.view, 1, &lib_errors, nullptr, false, filter);
    const bool lib_ok = lib_errors[0].empty();
    if (lib_ok && ok && lib.buf != ref.buf) fail("the checkpoint decoder and libjpeg's disagree on a pixel");
    if (!lib_ok && ok) fail("the checkpoint decoder decoded what libjpeg's refused:", lib_errors[0]);
    if (lib_ok && !ok && ref_errors[0].find("bad Huffman code") == std::string::npos) {
      fail("libjpeg's decoder decoded what the checkpoint decoder refused:", ref_errors[0]);
    }
  }

  // A window of the whole image's resize.
  {
    const int64_t rw = out_w + fw % 64, rh = out_h + fh % 64;
    const int64_t rx = fx * (rw - out_w) / 255 + kNudge[nudge & 3];
    const int64_t ry = fy * (rh - out_h) / 255 + kNudge[(nudge >> 2) & 3];
    const double window[4] = {double(rx), double(ry), double(out_w), double(out_h)};
    const int64_t sizes[2] = {rw, rh};
    const bool inside = rx >= 0 && ry >= 0 && rx + out_w <= rw && ry + out_h <= rh;
    Out resized(1, out_h, out_w, 0), lib(1, out_h, out_w, 0);
    std::vector<std::string> resized_errors, lib_errors;
    fastdata::decode_crop_resize({jpeg}, window, &no_flip, resized.view, 1, &resized_errors, nullptr, true,
                                 filter, nullptr, nullptr, sizes);
    const std::string& e = resized_errors[0];
    // (Whether the file decodes is the reference's answer where its crop lies in the image.)
    const bool crop_inside = crop64[2] > 0 && crop64[3] > 0 && crop64[0] >= 0 && crop64[1] >= 0 &&
                             crop64[0] + crop64[2] <= W && crop64[1] + crop64[3] <= H;
    if (e.empty() && !inside) fail("decoded a window outside the whole resize");
    if (crop_inside && e.empty() != (ok && inside)) {
      fail("a window of the whole resize decoded where the crop did not, or not where it did:", e);
    }
    if (!e.empty()) {
      for (uint8_t v : resized.buf) {
        if (v != kSentinel) fail("a failed window's output was written:", e);
      }
    } else {
      for (int y = 0; y < out_h; ++y) {
        for (int x = 0; x < out_w; ++x) {
          if (info.components == 1 && (resized.at(0, 1, y, x) != resized.at(0, 0, y, x) ||
                                       resized.at(0, 2, y, x) != resized.at(0, 0, y, x))) {
            fail("grayscale came out in color (a window of the whole resize)");
          }
        }
      }
      fastdata::decode_crop_resize({jpeg}, window, &no_flip, lib.view, 1, &lib_errors, nullptr, false, filter,
                                   nullptr, nullptr, sizes);
      if (!lib_errors[0].empty() || lib.buf != resized.buf) {
        fail("libjpeg's decoder disagrees on a window of the whole resize:", lib_errors[0]);
      }
    }
    // Pillow-SIMD's weights (16-bit, set by the whole resize's largest): the same answer, grey kept grey.
    fastdata::Resize simd = filter;
    simd.int16_weights = true;
    Out simd_out(1, out_h, out_w, 0);
    std::vector<std::string> simd_errors;
    fastdata::decode_crop_resize({jpeg}, window, &no_flip, simd_out.view, 1, &simd_errors, nullptr, true, simd,
                                 nullptr, nullptr, sizes);
    if (simd_errors[0].empty() != e.empty()) fail("Pillow-SIMD's weights decoded otherwise:", simd_errors[0]);
    for (int y = 0; y < out_h; ++y) {
      for (int x = 0; x < out_w; ++x) {
        const uint8_t r = simd_out.at(0, 0, y, x), g = simd_out.at(0, 1, y, x), b = simd_out.at(0, 2, y, x);
        if (!e.empty() && (r != kSentinel || g != kSentinel || b != kSentinel)) {
          fail("a failed window's output was written (Pillow-SIMD's weights)");
        }
        if (e.empty() && info.components == 1 && (g != r || b != r)) fail("grayscale came out in color (Pillow-SIMD's)");
      }
    }
  }

  // Once the bytes have decoded whole, the entropy decoder jumps between its checkpoints for
  // them (csrc/entropy.cpp): the same crop again must give the reference's pixels.
  if (ok) {
    Out again(1, out_h, out_w, 0);
    std::vector<std::string> again_errors;
    fastdata::decode_crop_resize({jpeg}, crop, &no_flip, again.view, 1, &again_errors, nullptr, true,
                                 filter);
    if (!again_errors[0].empty()) fail("decoded whole, then failed:", again_errors[0]);
    if (again.buf != ref.buf) fail("a decode from the checkpoints changed a pixel value");
  }
  return 0;
}
