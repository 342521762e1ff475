// Native JPEG decoding for image pipelines, over libjpeg-turbo's classic API: header reads, and
// a crop-aware decode that reads only the crop window (DCT-scaled when the window is at least
// twice the output) and resizes it as Pillow's `Image.resize(size, BILINEAR or BICUBIC, box=...)` does,
// straight into a strided slot of the batch buffer. decode.cpp decodes (its Huffman decoding:
// entropy.cpp), resample.cpp resizes; structure.cpp walks a file's container before any decode.
// Raw pointers only: no Python, no torch, so it all runs with the GIL released.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bytes.h"
#include "resample.h"  // Resize

namespace fastdata {

struct JpegInfo {
  int width = 0, height = 0, components = 0;
};

// The most pixels an image may claim: Pillow's MAX_IMAGE_PIXELS (the size at which it warns of a
// decompression bomb), the same number as fastdata._structure.MAX_IMAGE_PIXELS.
constexpr uint64_t kMaxImagePixels = 1024ull * 1024 * 1024 / 4 / 3;

// The most scans a JPEG may have (check_structure refuses more): libjpeg's progressive script
// writes 10 (6 for grayscale); each scan costs a pass over the whole image, however short. So a
// large image may have fewer: as many as pass over at most kMaxScanPixels pixels in all (24 at
// the pixel limit), and never fewer than 10 (max_scans).
constexpr int kMaxScans = 100;
constexpr uint64_t kMaxScanPixels = uint64_t(1) << 31;

inline int max_scans(int width, int height) {
  const uint64_t fit = kMaxScanPixels / (uint64_t(width) * uint64_t(height));
  return int(std::min<uint64_t>(kMaxScans, std::max<uint64_t>(10, fit)));
}

// The most chunks a PNG may have (check_structure refuses more): Pillow reads each in Python and
// keeps every private one, about 5 us and 100 bytes a chunk however empty, so a file of empty
// chunks would cost seconds a decode. Encoders split the image data into chunks of 8 KiB or more:
// a file at the 256 MiB read limit holds 32,768 of those.
constexpr int kMaxPngChunks = 1 << 17;

// The most compressed text chunks (zTXt, iTXt) a PNG may have (check_structure refuses more):
// Pillow inflates each up to 1 MiB, and counts what it inflated against its text limit only for
// some (not a zTXt without a keyword, nor an iTXt that is not UTF-8), so 3,000 of them cost 7 s
// a decode from a 3 MB file. Writers put a few there (a comment, an XMP packet).
constexpr int kMaxPngTexts = 64;

// The most markers (segments, restart and TEM markers alike) and the most fill bytes before
// markers a JPEG may have (check_structure refuses more): Pillow's parser reads each marker and
// each fill byte in Python (the CMYK path), about 1 us a byte, so 20 MiB of empty comments or of
// fill bytes would cost seconds a decode. Writers make a few dozen markers (a progressive JPEG
// with its tables, a colour profile split into APP2 segments: a few hundred).
constexpr int kMaxJpegMarkers = 1 << 12;
constexpr int kMaxJpegFill = 1 << 16;

// What check_structure found: the container, and the size its header claims.
enum ImageKind : int { kImageOther = 0, kImageJpeg = 1, kImagePng = 2 };
struct ImageStructure {
  int kind = kImageOther;
  int width = 0, height = 0;  // a JPEG's first frame header (SOFn), a PNG's IHDR
  int components = 0, scans = 0;  // a JPEG's (its frame header's components, its scans)
};

// Whether `src` is a whole JPEG or PNG, from its container structure alone (no pixel data is
// decoded): a JPEG's marker segments from SOI, through each scan's entropy-coded data, to EOI; a
// PNG's chunks from the signature to IEND; every length must fit in the file. Bytes after EOI or
// IEND are allowed. A PNG of more than kMaxPngChunks chunks, kMaxPngTexts compressed text chunks
// or two iCCP chunks, and a JPEG with more than max_scans(width, height) scans, kMaxJpegMarkers
// markers or kMaxJpegFill fill bytes before markers, or with fill bytes before a stuffed zero in
// its entropy-coded data (FF FF 00, see walk_jpeg), are refused, and so are stray bytes where a
// marker should be before the first scan (after it they are stepped over, as libjpeg does).
// Returns "" for a whole file (or one that is neither format: kind kImageOther, nothing
// checked), else why not ("empty file", "truncated JPEG: ...", "corrupt PNG: ..."). It cannot
// see corrupt entropy-coded data inside a whole structure.
std::string check_structure(const ByteSpan& src, ImageStructure* out);

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
// pixels (fractions of one allowed), of srcs[i] as RGB, resizes it to out.height x out.width as
// Pillow's resize with that box and `resize.filter` (bilinear or bicubic) does (with
// `resize.cut`, as its resize of the window cut out: torchvision's crop, then resize), mirrors it left-right where flips[i] is nonzero,
// and writes it to out[i]. errors[i] is "" for a sample that decoded, else the reason (out[i] is
// then left untouched): corrupt or truncated data, CMYK, a crop outside the image. Never throws,
// never prints.
// Where whole is null or whole[i] is nonzero, a baseline JPEG's rows below the window are
// entropy-decoded too, so that corrupt data anywhere in the file is an error whatever the crop;
// where whole[i] is 0 the decode stops at the window's last row (for a file the caller has seen
// decode whole without error). Samples are shared among up to `threads` threads.
// With `index`, a baseline JPEG is entropy-decoded by entropy.cpp's decoder, which keeps
// checkpoints of the bytes it decodes in the machine's index (index.h) and decodes them again
// from the checkpoint before the window (the same pixels as libjpeg's decoder, which `index`
// false keeps to, and its errors, a little stricter: entropy.h); bytes the index has are not
// decoded whole again, and bytes it lacks are, whatever `whole` says.
// Where vertical_first is not null, sample i takes the vertical pass first where
// vertical_first[i] is nonzero (resize.vertical_first is then ignored); where bicubic is not
// null, sample i is resized bicubic where bicubic[i] is nonzero, else bilinear (resize.filter is
// then ignored). Where resized is not null and resized[2*i], resized[2*i+1] are both > 0, sample
// i's whole image is resized to that width and height and its crop is the window (x, y) of it,
// of out's size, in whole pixels (resize.whole_w and whole_h: torchvision's Resize, then a crop).
void decode_crop_resize(const std::vector<ByteSpan>& srcs, const double* crops,
                        const uint8_t* flips, const OutView& out, int threads,
                        std::vector<std::string>* errors, const uint8_t* whole = nullptr,
                        bool index = true, Resize resize = Resize(),
                        const uint8_t* vertical_first = nullptr, const uint8_t* bicubic = nullptr,
                        const int64_t* resized = nullptr);

// printf into a std::string of at most 255 characters: the error messages of the native decoder
// (structure.cpp).
std::string format(const char* fmt, ...);


// Bytes the calling thread's decoder keeps between decodes (its copy of the file, row buffers,
// the entropy decoder's buffers): a buffer an oversized file grew past 4 MiB is freed after it.
size_t decoder_scratch_bytes();

}  // namespace fastdata
