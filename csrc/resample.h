// Pillow-exact resampling for the native decoder (decode.cpp) and for arrays of pixels
// (resize_images, `fastdata run`'s in-memory datasets): the taps of Pillow's separable
// bilinear or bicubic filter for a box of the input, in its fixed point, and the kernels that apply them
// to decoded RGBX rows, the same bytes whichever the CPU runs (generic C++, SSE4.1, AVX2).
// Raw pointers only: no Python, no torch, no libjpeg.
#pragma once
#include <cstdint>
#include <vector>

namespace fastdata {

// Pillow's resampling filters, as its Image.Resampling names them (the values are fastdata's).
enum class Filter { kBilinear = 0, kBicubic = 1 };

// How a window is resized: with `filter`, either in place, as Pillow's resize(box=) does (the
// filter reads the pixels around the window too), or `cut` out first, as torchvision's crop then
// resize does (the filter reads none outside it); the horizontal pass first, as Pillow does, or
// with `vertical_first` the vertical one, as Pillow 13 does for some sizes. Each pass rounds and
// clips to 0..255, so where a bicubic filter overshoots the order changes a pixel. With `whole_w`
// and `whole_h` (both > 0), the window is whole pixels of the whole image resized to that size,
// as torchvision's Resize, then a crop, makes it (`cut` is then ignored).
// With `int16_weights`, each pass's weights are Pillow-SIMD's: 16-bit, at the most fraction bits
// (up to 22) that keep the pass's largest weight under 2^15, where classic Pillow's have 22.
struct Resize {
  Filter filter = Filter::kBilinear;
  bool cut = false;
  bool vertical_first = false;
  int whole_w = 0, whole_h = 0;
  bool int16_weights = false;
};

// One axis of Pillow's separable resampling: for output pixel i, input pixels
// start[i] .. start[i] + count[i] - 1 weighted by weights[i * ksize ...] in fixed point.
struct Taps {
  int ksize = 0;
  int precision = 22;  // the weights' fraction bits: a sum of taps is shifted right by it
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

// A horizontal kernel resamples two decoded RGBX rows per call (ra into da, rb into db; rb may be
// ra); a vertical kernel sums `taps` rows `row_stride` bytes apart with weights w of `precision`
// fraction bits into a line.
using HorizontalKernel = void (*)(const uint8_t* ra, const uint8_t* rb, int x0, const Taps&,
                                  uint8_t* da, uint8_t* db, int out_w);
using VerticalKernel = void (*)(const uint8_t*, int64_t, const int32_t*, int, int, uint8_t*, int);

// The taps for resampling input pixels [in0, in1) (C floats, as Pillow parses its box) of an
// axis of in_size pixels to out_size pixels, as Pillow's Image.resize(filter, box=...) computes them.
// With `of` > 0, the taps of output pixels first .. first + out_size - 1 of a resize to `of`
// pixels: only the window's, so its cost is the window's whatever size it is cut from (with
// `int16_weights`, Pillow-SIMD's, the largest weight of all `of` pixels sets the precision: a
// pass over all of them, `of` times the taps).
void compute_taps(int in_size, float in0, float in1, int out_size, Filter filter, Taps* t, int of = 0,
                  int first = 0, bool int16_weights = false);

// compute_taps for the window [in0, in1) resized as `resize` says: cut out first, the taps are
// those of the image of its whole pixels [floor(in0), ceil(in1)) alone, moved to their place (for
// a window of whole pixels, exactly those of Pillow's resize of the crop).
void window_taps(int in_size, float in0, float in1, int out_size, Resize resize, Taps* t);

// Fills t->split and t->pairs, the weights in the form the SIMD horizontal kernels read.
void split_weights(Taps* t, int out_size);

// Whether the horizontal kernel pick_horizontal gives reads the split weights.
bool horizontal_needs_split();

// The kernels for this CPU (FASTDATA_DECODE_SIMD=sse4.1 or =none caps the choice): the horizontal
// one for `taps` taps an output pixel, and the vertical one.
HorizontalKernel pick_horizontal(int taps);
VerticalKernel pick_vertical();

// Writes one resampled RGBX line of out_w pixels to an output row: channel c of pixel xx at
// c * sc + xx * sx bytes from dst, pixels in reverse order when flip.
void write_line(const uint8_t* line, int out_w, uint8_t* dst, int64_t sc, int64_t sx, bool flip);

// Resizes n images of h x w pixels of c channels (1 or 3; uint8, each contiguous, one after
// another in src) into n of oh x ow in out: image i's box boxes[4i .. 4i + 3] = (x0, y0, x1, y1),
// whole pixels inside the image, cut out, then resized as Pillow's resize of that crop does (so
// torchvision's F.resize or F.resized_crop of the PIL image), with `resize`'s filter and weights
// (its `cut` taken as set), the vertical pass first where vertical_first (null: nowhere) says so.
// A 1-channel image is resized as its RGB copy: Pillow takes each band of an L or RGB image
// through the same taps and roundings.
void resize_images(const uint8_t* src, int64_t n, int h, int w, int c, const int64_t* boxes, uint8_t* out,
                   int oh, int ow, Resize resize, const uint8_t* vertical_first, int threads);

}  // namespace fastdata
