#include "decode.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t without including them
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include <jpeglib.h>
#include <jerror.h>  // the warning codes (JWRN_...)

#include "entropy.h"
#include "parallel.h"
#include "resample.h"

namespace fastdata {
namespace {

// Refusing larger images keeps a hostile header from making libjpeg allocate gigabytes (a
// progressive JPEG buffers every coefficient of the image before the first row). The loaders
// refuse them before any decode (fastdata._structure.MAX_IMAGE_PIXELS); kMaxImagePixels (decode.h)
// is the same limit for direct callers.


struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands &pub around as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 96];
  bool past_header = false;  // jpeg_read_header has returned (the first scan's header is read)
};

// libjpeg's default error_exit prints and calls exit(); this one keeps the message and jumps
// back to the setjmp in Decoder, which aborts the decompression and reports it.
[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->pub.format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Strict: a warning is an error. libjpeg warns and carries on for truncated or corrupt data
// (JWRN_JPEG_EOF "Premature end of JPEG file", JWRN_HIT_MARKER, ...), padding the image with
// gray; a training sample should be the image or an error the loader can act on, never a guess.
// One warning is not, past the header: bytes skipped on the way to a marker (JWRN_EXTRANEOUS_DATA,
// "N extraneous bytes before marker 0xd0"), as after a restart segment's last block, where every
// block was decoded from the bits before them. Webcams (Logitech's C270 among them) write them
// into every frame, and Pillow, torchvision, OpenCV and DALI decode such files. In the header
// (before the first scan) they stay an error, as check_structure refuses them there (DALI's
// parser does). Trace messages (level >= 0) are dropped, so nothing is ever printed.
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  const auto* err = reinterpret_cast<const ErrorManager*>(cinfo->err);
  if (err->pub.msg_code == JWRN_EXTRANEOUS_DATA && err->past_header) return;
  on_error(cinfo);
}

// Checks libjpeg would make anyway, with clearer messages and no decompressor touched.
std::string precheck(const ByteSpan& src) {
  if (src.size == 0) return "empty input: 0 bytes";
  if (src.size < 2) return format("not a JPEG file: 1 byte (0x%02x)", src.data[0]);
  if (src.data[0] != 0xFF || src.data[1] != 0xD8) {
    return format("not a JPEG file: starts with 0x%02x 0x%02x", src.data[0], src.data[1]);
  }
  return {};
}

// A multi-scan (progressive) JPEG is decoded from a buffer of all its coefficients, which libjpeg
// allocates whole before the first row: 2 bytes a coefficient, up to 537 MB for an image at the
// pixel limit from a file of a few hundred kB. What a process's decoding threads hold in such
// buffers at once is bounded by kCoefficientBudget (one image at a time past it), so that a
// batch of such files holds at most that, not a buffer a thread (a machine's cores each
// decoding one). The size is bounded from the frame header: every component at full
// resolution, whatever its sampling.
constexpr size_t kCoefficientBudget = size_t(1) << 30;
constexpr size_t kCoefficientsCounted = size_t(16) << 20;  // smaller buffers are not counted

size_t coefficient_bytes(const ImageStructure& s) {
  const size_t blocks = (size_t(s.width) + 7) / 8 * ((size_t(s.height) + 7) / 8);
  const size_t bytes = blocks * size_t(std::max(s.components, 1)) * 64 * sizeof(JCOEF);
  return bytes >= kCoefficientsCounted ? bytes : 0;
}

// A share of kCoefficientBudget held for the life of a decode: waits while other threads hold
// so much that this would pass it, unless none holds any.
class MemoryGrant {
 public:
  explicit MemoryGrant(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    std::unique_lock<std::mutex> lock(mutex());
    cv().wait(lock, [&] { return held() == 0 || held() + bytes_ <= kCoefficientBudget; });
    held() += bytes_;
  }
  ~MemoryGrant() {
    if (bytes_ == 0) return;
    {
      std::lock_guard<std::mutex> lock(mutex());
      held() -= bytes_;
    }
    cv().notify_all();
  }
  MemoryGrant(const MemoryGrant&) = delete;
  MemoryGrant& operator=(const MemoryGrant&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::condition_variable& cv() {
    static std::condition_variable c;
    return c;
  }
  static size_t& held() {
    static size_t h = 0;
    return h;
  }
  size_t bytes_;
};

// A thread's decoder: its row buffers and filter taps are reused from image to image, its libjpeg
// decompressor is made anew for each (see fresh()).
class Decoder {
 public:
  Decoder() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = on_error;
    err_.pub.emit_message = on_message;
    if (setjmp(err_.jump) == 0) {
      jpeg_create_decompress(&cinfo_);
      created_ = true;
    }
  }
  ~Decoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  std::string info(const ByteSpan& src, JpegInfo* out) {
    std::string why = precheck(src);
    if (!why.empty()) return why;
    if (!fresh()) return "out of memory";
    if (!read_info(src, out)) return err_.message;
    return {};
  }

  std::string decode(const ByteSpan& caller, const double* crop, bool flip, bool whole,
                     bool use_index, Resize resize, const OutView& out, int64_t index) {
    // Everything below reads a private copy: the caller's buffer may be a bytearray, numpy
    // array or mmap that another thread rewrites while the GIL is released, and the walk,
    // libjpeg and the checkpoints' hash must all see the same bytes.
    copy_.assign(caller.data, caller.data + caller.size);
    const ByteSpan src{copy_.data(), copy_.size()};
    std::string why = decode_copy(src, crop, flip, whole, use_index, resize, out, index);
    trim();
    return why;
  }

  // The bytes this thread's decoder keeps between decodes.
  size_t scratch_bytes() const {
    return copy_.capacity() + row_.capacity() + rows_.capacity() + line_.capacity() +
           entropy_.scratch_bytes();
  }

 private:
  // A buffer over this many bytes is freed after the decode that grew it: one oversized file
  // does not hold its copy for the thread's life (a typical photo's buffers stay and are reused).
  static constexpr size_t kScratchKeep = size_t(4) << 20;

  void trim() {
    for (std::vector<uint8_t>* b : {&copy_, &row_, &rows_, &line_}) {
      if (b->capacity() > kScratchKeep) std::vector<uint8_t>().swap(*b);
    }
    entropy_.trim(kScratchKeep);
  }

  std::string decode_copy(const ByteSpan& src, const double* crop, bool flip, bool whole,
                          bool use_index, Resize resize, const OutView& out, int64_t index) {
    std::string why = precheck(src);
    ImageStructure structure;
    // A decode reads only the rows the crop needs; the walk makes a file cut short an error
    // whatever the crop.
    if (why.empty()) why = check_structure(src, &structure);
    if (!why.empty()) return why;
    if (!fresh()) return "out of memory";
    const MemoryGrant grant(structure.scans > 1 ? coefficient_bytes(structure) : 0);
    try {
      if (!decode_window(src, crop, out.height, out.width, whole, use_index, resize)) {
        return err_.message;
      }
    } catch (const std::bad_alloc&) {
      entropy_.detach(false);
      jpeg_abort_decompress(&cinfo_);  // safe in any state; readies cinfo_ for the next image
      return "out of memory";
    }
    resample_columns(out, index, flip);
    return {};
  }

  // A decompressor keeps the quantization and Huffman tables of the images it read (libjpeg's
  // support for abbreviated datastreams, which leave them out), so a JPEG missing a table would
  // decode with an earlier image's instead of failing as in Pillow, and the same bytes would
  // decode or not depending on what the thread read before. So every image gets a new one
  // (a few small allocations, next to a decode's); false when it cannot be made.
  bool fresh() {
    if (created_ && used_) {
      jpeg_destroy_decompress(&cinfo_);
      created_ = false;
    }
    if (!created_) {
      if (setjmp(err_.jump) == 0) {
        jpeg_create_decompress(&cinfo_);  // keeps cinfo_.err
        created_ = true;
      }
    }
    used_ = created_;
    return created_;
  }

  // Everything between a setjmp and the libjpeg calls that may longjmp to it keeps its state
  // in members, never in locals with destructors: longjmp skips destructors.
  bool read_info(const ByteSpan& src, JpegInfo* out) {
    if (setjmp(err_.jump)) {
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    err_.past_header = false;
    jpeg_mem_src(&cinfo_, src.data, static_cast<unsigned long>(src.size));
    jpeg_read_header(&cinfo_, TRUE);
    out->width = int(cinfo_.image_width);
    out->height = int(cinfo_.image_height);
    out->components = cinfo_.num_components;
    jpeg_abort_decompress(&cinfo_);
    return true;
  }

  bool fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err_.message, sizeof err_.message, fmt, ap);
    va_end(ap);
    entropy_.detach(false);
    jpeg_abort_decompress(&cinfo_);
    return false;
  }

  // Decodes the rows and columns of the crop window that the resampling reads, and runs the
  // horizontal pass on each row as it arrives, into rows_ (one row of out_w RGBX pixels per
  // input row used): the decoded window itself is never held whole. With
  // `resize.vertical_first`, rows_ holds the decoded rows themselves (row_bytes_ apart), for
  // resample_columns to take the vertical pass first. With `whole`, the rows below the window
  // are entropy-decoded as well (see below).
  bool decode_window(const ByteSpan& src, const double* crop, int out_h, int out_w, bool whole,
                     bool use_index, Resize resize) {
    if (setjmp(err_.jump)) {
      entropy_.detach(false);
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    err_.past_header = false;
    jpeg_mem_src(&cinfo_, src.data, static_cast<unsigned long>(src.size));
    jpeg_read_header(&cinfo_, TRUE);
    err_.past_header = true;
    const int64_t W = cinfo_.image_width, H = cinfo_.image_height;
    if (uint64_t(W) * uint64_t(H) > kMaxImagePixels) {
      return fail("image of %lldx%lld pixels is over the limit of %llu pixels", (long long)W,
                  (long long)H, (unsigned long long)kMaxImagePixels);
    }
    switch (cinfo_.jpeg_color_space) {
      case JCS_GRAYSCALE:
      case JCS_YCbCr:
      case JCS_RGB: break;
      // libjpeg has no CMYK -> RGB conversion; the caller's Pillow fallback has one.
      case JCS_CMYK: return checked_for_pillow("CMYK");
      case JCS_YCCK: return checked_for_pillow("YCCK");
      default:
        return fail("unsupported JPEG color space (%d components)", cinfo_.num_components);
    }
    // The window may hold fractions of a pixel (a resize before a crop maps the crop to such a
    // box in the original image): the resampling takes its edges as they are, as Pillow's
    // resize(box=) does. (Written so that NaN fails every test.)
    const double x = crop[0], y = crop[1], w = crop[2], h = crop[3];
    const bool resized = resize.whole_w > 0 && resize.whole_h > 0;
    if (resized) {
      if (!(x >= 0 && y >= 0 && x == std::floor(x) && y == std::floor(y) && w == out_w && h == out_h &&
            x + w <= resize.whole_w && y + h <= resize.whole_h)) {
        return fail("crop (%g, %g, %g, %g) not whole pixels of the image resized to %dx%d", x, y, w, h,
                    resize.whole_w, resize.whole_h);
      }
    } else if (!(w > 0 && h > 0 && x >= 0 && y >= 0 && x + w <= double(W) && y + h <= double(H))) {
      return fail("crop (%g, %g, %g, %g) outside the %lldx%lld image", x, y, w, h, (long long)W,
                  (long long)H);
    }
    // DCT scaling: the IDCT itself shrinks by 2, 4 or 8, the cheapest way to drop pixels the
    // resize would average away anyway. Taken only while the scaled window still has at least
    // the output's pixels, so the resize never enlarges what it was handed. A whole resize is
    // made at full scale, as Pillow's resize of the whole decode is.
    int denom = 1;
    for (int d : {8, 4, 2}) {
      if (resized) break;
      if (w >= double(out_w) * d && h >= double(out_h) * d) {
        denom = d;
        break;
      }
    }
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = unsigned(denom);
    // RGB with a pad byte (see the kernels); grayscale comes out as R = G = B.
    cinfo_.out_color_space = JCS_EXT_RGBX;
    cinfo_.dct_method = JDCT_ISLOW;    // Pillow's (libjpeg's default): the same pixels as there
    cinfo_.do_fancy_upsampling = TRUE;
    jpeg_calc_output_dimensions(&cinfo_);
    const int sw = int(cinfo_.output_width), sh = int(cinfo_.output_height);

    // The box in the scaled image's pixels: a scaled pixel j covers original pixels
    // [j * denom, (j + 1) * denom), so the box just divides (exactly: denom is a power of 2).
    // A whole resize's window: the taps of the whole image's resize, for the window's pixels.
    const float s = 1.0f / float(denom);
    if (resized) {
      compute_taps(sw, 0.0f, float(sw), out_w, resize.filter, &htaps_, resize.whole_w, int(x), resize.int16_weights);
      compute_taps(sh, 0.0f, float(sh), out_h, resize.filter, &vtaps_, resize.whole_h, int(y), resize.int16_weights);
    } else {
      window_taps(sw, float(x) * s, float(x + w) * s, out_w, resize, &htaps_);
      window_taps(sh, float(y) * s, float(y + h) * s, out_h, resize, &vtaps_);
    }

    jpeg_start_decompress(&cinfo_);
    // One column more on each side than the taps read: fancy (smooth) chroma upsampling at the
    // edge of a cropped window sees no neighbour beyond it and replicates the edge instead, so
    // the window's outermost columns differ from a full decode's (about 1 crop in 5 without
    // the margin). jpeg_crop_scanline then widens the window to iMCU boundaries and
    // says where it starts. Only for luma MCUs of up to 4 blocks (4:4:4, 4:2:2, 4:4:0, 4:2:0,
    // 4:1:1): libjpeg-turbo 2.1.5 crops 4x2 and 2x4 MCUs wrongly at 1/2 and 1/4 scale (found by
    // comparing with full decodes); the rare larger MCUs decode full width.
    JDIMENSION xoff = JDIMENSION(std::max(0, htaps_.lo - 1));
    JDIMENSION cw = JDIMENSION(std::min(sw, htaps_.hi + 1)) - xoff;
    const bool crop_ok = cinfo_.max_h_samp_factor * cinfo_.max_v_samp_factor <= 4;
    if (!crop_ok) {
      xoff = 0;
      cw = JDIMENSION(sw);
    }
    if (cw < JDIMENSION(sw)) jpeg_crop_scanline(&cinfo_, &xoff, &cw);
    const bool indexed = use_index && entropy_.attach(&cinfo_, src);
    x0_ = int(xoff);
    y0_ = vtaps_.lo;
    const int rows = vtaps_.hi - vtaps_.lo;
    // Two rows at a time, each padded: the horizontal kernels read `taps` taps (rounded up to
    // even) from every start.
    const size_t row_bytes = size_t(cw + htaps_.taps + 1) * 4;
    vertical_first_ = resize.vertical_first;
    row_bytes_ = row_bytes;
    row_.assign(2 * row_bytes, 0);
    rows_.resize(size_t(rows) * (vertical_first_ ? row_bytes : size_t(out_w) * 4));
    const HorizontalKernel horizontal = pick_horizontal(htaps_.taps);
    if (horizontal_needs_split()) split_weights(&htaps_, out_w);
    if (y0_ > 0 && jpeg_skip_scanlines(&cinfo_, JDIMENSION(y0_)) != JDIMENSION(y0_)) {
      return fail("Premature end of JPEG file (could not skip to row %d)", y0_);
    }
    for (int r = 0; r < rows; r += 2) {
      const int want = std::min(2, rows - r);
      uint8_t* stored = rows_.data() + size_t(r) * row_bytes;  // (vertical first: the rows as decoded)
      JSAMPROW p[2] = {vertical_first_ ? stored : row_.data(),
                       vertical_first_ ? stored + row_bytes : row_.data() + row_bytes};
      for (int got = 0; got < want;) {
        const JDIMENSION n = jpeg_read_scanlines(&cinfo_, p + got, JDIMENSION(want - got));
        if (n == 0) return fail("Premature end of JPEG file (row %d of %d)", y0_ + r + got, sh);
        got += int(n);
      }
      if (vertical_first_) continue;
      uint8_t* d = rows_.data() + size_t(r) * out_w * 4;
      horizontal(p[0], want == 2 ? p[1] : p[0], x0_, htaps_, d, want == 2 ? d + out_w * 4 : d,
                 out_w);
    }
    // The rows below the window are entropy-decoded too (Huffman decoding only, no IDCT,
    // upsampling or colour conversion), so that corrupt data there (a file cut short and closed
    // with an end marker, a bad Huffman code) is an error for every crop, not only for the crops
    // that reach it. With the index, only bytes it has are spared that (proven whole: found by
    // a keyed hash of these very bytes); `whole` is not trusted there, since a record kept by
    // sample id cannot tell a file from another written at the same size, and neither are
    // files the entropy decoder does not take (restart markers out of turn) or bytes a full
    // index cannot take. Without the index, `whole` says it. libjpeg's skip to the very end
    // returns without decoding, so the skip stops a row short and the last row is read. A
    // multi-scan (progressive) image was read whole by jpeg_start_decompress already.
    if (indexed) {
      if (!entropy_.proven_whole()) entropy_.decode_rest(&cinfo_);
    } else if ((whole || use_index) && !jpeg_has_multiple_scans(&cinfo_)) {
      const JDIMENSION left = cinfo_.output_height - cinfo_.output_scanline;
      if (left > 1 && jpeg_skip_scanlines(&cinfo_, left - 1) != left - 1) {
        return fail("Premature end of JPEG file (below the crop window)");
      }
      JSAMPROW p = row_.data();
      if (left > 0 && jpeg_read_scanlines(&cinfo_, &p, 1) != 1) {
        return fail("Premature end of JPEG file (last row)");
      }
    }
    entropy_.detach(true);
    // Stop here, before the end-of-image bookkeeping of jpeg_finish_decompress.
    jpeg_abort_decompress(&cinfo_);
    return true;
  }

  // A CMYK or YCCK JPEG, which the caller decodes with Pillow (the "unsupported" failure says
  // so), decoded whole first, to CMYK at 1/8 scale and thrown away: corrupt or truncated data is
  // then this decode's error, as in any other colour space, not rows Pillow (or DALI) fills.
  // Called inside decode_window's setjmp.
  bool checked_for_pillow(const char* space) {
    cinfo_.out_color_space = JCS_CMYK;
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = 8;
    jpeg_start_decompress(&cinfo_);
    row_.assign(size_t(cinfo_.output_width) * size_t(cinfo_.output_components), 0);
    JSAMPROW p = row_.data();
    while (cinfo_.output_scanline < cinfo_.output_height) {
      if (jpeg_read_scanlines(&cinfo_, &p, 1) != 1) {
        return fail("Premature end of JPEG file (row %u of %u)", cinfo_.output_scanline,
                    cinfo_.output_height);
      }
    }
    return fail("unsupported JPEG color space %s", space);
  }

  // Vertical pass from rows_ into out[index], mirrored while written when `flip`; with
  // vertical_first_, the vertical pass on the decoded rows, then the horizontal one, two output
  // rows at a time.
  void resample_columns(const OutView& out, int64_t index, bool flip) {
    const int n = out.width * 4, ksize = vtaps_.ksize;
    const VerticalKernel vertical = pick_vertical();
    uint8_t* base = out.data + index * out.batch_stride;
    if (vertical_first_) {
      // The decoded rows' used width; each vertical pass goes into a row of row_, padded as
      // decode_window made it for the horizontal kernel (it decoded into rows_ instead).
      const int used = int(row_bytes_ / 4) - htaps_.taps - 1;
      const HorizontalKernel horizontal = pick_horizontal(htaps_.taps);
      line_.resize(2 * size_t(n));
      for (int yy = 0; yy < out.height; yy += 2) {
        const int want = std::min(2, out.height - yy);
        for (int k = 0; k < want; ++k) {
          vertical(rows_.data() + size_t(vtaps_.start[yy + k] - y0_) * row_bytes_, int64_t(row_bytes_),
                   &vtaps_.weights[size_t(yy + k) * ksize], vtaps_.count[yy + k], vtaps_.precision,
                   row_.data() + k * row_bytes_, used * 4);
        }
        const uint8_t* second = want == 2 ? row_.data() + row_bytes_ : row_.data();
        horizontal(row_.data(), second, x0_, htaps_, line_.data(), want == 2 ? line_.data() + n : line_.data(),
                   out.width);
        for (int k = 0; k < want; ++k) {
          write_line(line_.data() + k * n, out.width, base + (yy + k) * out.stride_h, out.stride_c,
                     out.stride_w, flip);
        }
      }
      return;
    }
    line_.resize(size_t(n));
    for (int yy = 0; yy < out.height; ++yy) {
      vertical(rows_.data() + size_t(vtaps_.start[yy] - y0_) * n, n,
               &vtaps_.weights[size_t(yy) * ksize], vtaps_.count[yy], vtaps_.precision, line_.data(), n);
      write_line(line_.data(), out.width, base + yy * out.stride_h, out.stride_c, out.stride_w,
                 flip);
    }
  }

  jpeg_decompress_struct cinfo_{};
  ErrorManager err_{};
  EntropyDecoder entropy_;
  bool created_ = false, used_ = false;
  Taps htaps_, vtaps_;
  int x0_ = 0, y0_ = 0;  // the decoded window's first column and row, in scaled pixels
  bool vertical_first_ = false;
  size_t row_bytes_ = 0;  // a padded decoded row's bytes
  std::vector<uint8_t> copy_;  // the file being decoded (see decode)
  std::vector<uint8_t> row_, rows_, line_;
};

// Each thread's decompressor, made on its first image and kept: the caller's thread keeps its
// own across calls, a worker's dies with the worker.
Decoder& this_thread_decoder() {
  thread_local Decoder decoder;
  return decoder;
}

}  // namespace

std::string jpeg_info(const ByteSpan& src, JpegInfo* info) {
  try {
    return this_thread_decoder().info(src, info);
  } catch (const std::bad_alloc&) {
    return "out of memory";
  }
}

size_t decoder_scratch_bytes() { return this_thread_decoder().scratch_bytes(); }

void decode_crop_resize(const std::vector<ByteSpan>& srcs, const double* crops,
                        const uint8_t* flips, const OutView& out, int threads,
                        std::vector<std::string>* errors, const uint8_t* whole, bool index,
                        Resize resize, const uint8_t* vertical_first, const uint8_t* bicubic,
                        const int64_t* resized) {
  const int64_t n = int64_t(srcs.size());
  errors->assign(size_t(n), std::string());
  parallel_for(n, threads, [&](int64_t i) {
    std::string& err = (*errors)[size_t(i)];
    Resize r = resize;
    if (vertical_first != nullptr) r.vertical_first = vertical_first[i] != 0;
    if (bicubic != nullptr) r.filter = bicubic[i] != 0 ? Filter::kBicubic : Filter::kBilinear;
    if (resized != nullptr && resized[2 * i] > 0 && resized[2 * i + 1] > 0) {
      r.whole_w = int(std::min<int64_t>(resized[2 * i], INT32_MAX));
      r.whole_h = int(std::min<int64_t>(resized[2 * i + 1], INT32_MAX));
    }
    try {
      err = this_thread_decoder().decode(srcs[size_t(i)], crops + 4 * i, flips[i] != 0,
                                         whole == nullptr || whole[i] != 0, index, r, out, i);
    } catch (const std::bad_alloc&) {  // the thread's decoder, or the decode's buffers
      err = "out of memory";
    }
  });
}

}  // namespace fastdata
