// Native JPEG decoding for image pipelines, over libjpeg-turbo's classic API: header reads, and
// a crop-aware decode that reads only the crop window (DCT-scaled when the window is at least
// twice the output) and resizes it as Pillow's `Image.resize(size, BILINEAR, box=...)` does,
// straight into a strided slot of the batch buffer.
// Raw pointers only: no Python, no torch, so it all runs with the GIL released.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastdata {

struct ByteSpan {
  const uint8_t* data;
  size_t size;
};

struct JpegInfo {
  int width = 0, height = 0, components = 0;
};

// Reads the header of `src` (no pixel data) into *info. Returns "" on success, else why it
// could not (libjpeg's message, or ours for empty and non-JPEG input).
std::string jpeg_info(const ByteSpan& src, JpegInfo* info);

// Where the outputs go: sample i is written at data + i * batch_stride, element (c, y, x) at
// c * stride_c + y * stride_h + x * stride_w (all in bytes: the output is uint8), so
// contiguous NCHW, channels_last and per-sample HWC buffers are all written in place.
struct OutView {
  uint8_t* data;
  int64_t batch_stride, stride_c, stride_h, stride_w;
  int height, width;
};

// For every i: decodes the window crops[4*i .. 4*i+3] = (x, y, w, h), in the original image's
// pixels, of srcs[i] as RGB, resizes it to out.height x out.width as Pillow's bilinear resize
// with that box does, mirrors it left-right where flips[i] is nonzero, and writes it to out[i].
// errors[i] is "" for a sample that decoded, else the reason (out[i] is then left untouched):
// corrupt or truncated data, CMYK, a crop outside the image. Never throws, never prints.
// Samples are shared among up to `threads` threads.
void decode_crop_resize(const std::vector<ByteSpan>& srcs, const int32_t* crops,
                        const uint8_t* flips, const OutView& out, int threads,
                        std::vector<std::string>* errors);

}  // namespace fastdata
