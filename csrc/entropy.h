// The Huffman decoding of single-scan baseline JPEGs, in place of libjpeg-turbo's own, from
// checkpoints that let a decode of bytes seen before begin near its crop window.
//
// libjpeg's decoders must entropy-decode every MCU from the top left corner to the crop window's
// last one (libjpeg-turbo's jpeg_skip_scanlines and jpeg_crop_scanline save the IDCT, upsampling
// and colour conversion of what they skip, not its Huffman decoding): the bits have no landmarks
// and each block's DC coefficient is a difference from the one before. A file's first decode
// reads its scan whole and notes, at up to 64 MCUs spread over its rows (index.h's bound), the
// first bit and the DC predictors there (a checkpoint); the machine's checkpoint index (index.h)
// keeps them for every later decode of the same bytes, in any process, which jumps to the
// checkpoint before each window row and decodes from there only what the window's IDCT needs.
//
// libjpeg-turbo has no API for this, so this file replaces its entropy decoder's decode_mcu
// method (jpegint.h: the module interface every libjpeg decoder is built from): the coefficient
// controller calls it once per MCU, in order, with NULL for the MCUs jpeg_skip_scanlines skips,
// and runs the IDCT only on the window's MCU columns. No library decodes Huffman data from a
// caller's checkpoint, which is why this is written here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t without including them
#include <memory>
#include <vector>

#include <jpeglib.h>

#include "decode.h"

namespace fastdata {

struct EntropyIndex;

// A thread's entropy decoder: attached to one decompression at a time (after
// jpeg_start_decompress and jpeg_crop_scanline), it takes over decode_mcu until the cinfo is
// aborted. The coefficients are libjpeg-turbo's, bit for bit (its IDCT then makes the same
// pixels). Errors go through cinfo's error manager with libjpeg's own warnings (bad Huffman
// code, premature end of data), which the caller makes errors. It is stricter than libjpeg in
// one way: a bad Huffman code is always an error, where libjpeg-turbo's fast path (all but a
// scan's last few kB) reads it as symbol 0 without a warning.
class EntropyDecoder {
 public:
  EntropyDecoder();
  ~EntropyDecoder();
  EntropyDecoder(const EntropyDecoder&) = delete;
  EntropyDecoder& operator=(const EntropyDecoder&) = delete;

  // Takes over cinfo's Huffman decoding when the image is a single-scan baseline JPEG whose
  // restart markers, if it has any, all come in turn (nearly every photo saved by Pillow,
  // libjpeg or a camera); false leaves libjpeg's decoder in place. `file` is the whole file,
  // cinfo's source, in memory no one else can change during the decode (decode.cpp's private
  // copy): its checkpoints are found and kept by a keyed hash of exactly these bytes.
  bool attach(j_decompress_ptr cinfo, const ByteSpan& file);
  // Whether these bytes have decoded whole without error before (the index has their
  // checkpoints, which only a whole decode without error publishes): corrupt data anywhere in
  // them would have failed that decode.
  bool proven_whole() const;
  // Entropy-decodes every MCU not yet decoded to the scan's end, as a whole decode's check of
  // the rows below the window; errors as above.
  void decode_rest(j_decompress_ptr cinfo);
  // After a decode without error that read the whole scan: publishes the checkpoints recorded
  // for the next decodes of these bytes. Always ends the attachment.
  void detach(bool ok);
  // The bytes this decoder's buffers hold between decodes (the scan's data, its checkpoints);
  // trim frees each buffer over `keep` bytes, so that one oversized file does not keep its
  // buffers for the thread's life. Not while attached.
  size_t scratch_bytes() const;
  void trim(size_t keep);

  struct State;  // the decode in progress (entropy.cpp)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace fastdata
