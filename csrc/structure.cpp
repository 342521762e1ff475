// The container walks behind check_structure (decode.h): a JPEG's marker segments and scans, a
// PNG's chunks. They follow markers and lengths and never look at pixel data (no libjpeg), so they
// run at memchr speed. fastdata/_structure.py has the same walks in Python (the fallback for a
// build without this file), with the same messages; the tests hold them equal.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "decode.h"

namespace fastdata {

std::string format(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

namespace {

inline uint32_t be16(const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; }
inline uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

std::string jpeg_ends_early(size_t n) {
  return format("truncated JPEG: no end-of-image marker (the file ends after %zu bytes)", n);
}

// From SOI through every marker segment (its length must fit in the file) and, after each SOS,
// the entropy-coded data to the marker that ends it, up to EOI. The first frame header (SOF0-15;
// C4, C8 and CC in that range are other markers) gives the size.
std::string walk_jpeg(const ByteSpan& src, ImageStructure* out) {
  const uint8_t* d = src.data;
  const size_t n = src.size;
  size_t pos = 2;
  bool frame = false, scan = false;
  int scans = 0, markers = 0;
  size_t fill = 0;
  for (;;) {
    if (pos >= n) return jpeg_ends_early(n);
    // Stray bytes where a marker should be: libjpeg steps over them to the next marker (non-0xFF
    // bytes, and FF 00 pairs) with a warning, which decode.cpp lets pass once the first scan's
    // header is read, and so does this walk. Before that they are refused: DALI's parser
    // refuses them ("Invalid marker"), so a file would pass on one backend and fail on another.
    if (d[pos] != 0xFF) {
      if (!scan) return format("corrupt JPEG: no marker at byte %zu (0x%02x)", pos, d[pos]);
      const void* ff = std::memchr(d + pos, 0xFF, n - pos);
      if (!ff) return jpeg_ends_early(n);
      pos = size_t(static_cast<const uint8_t*>(ff) - d);
    }
    const size_t at = pos;
    while (pos < n && d[pos] == 0xFF) ++pos;  // fill bytes may come before a marker
    if (pos >= n) return jpeg_ends_early(n);
    if (scan && d[pos] == 0x00) {
      ++pos;
      continue;
    }
    fill += pos - at - 1;
    if (fill > size_t(kMaxJpegFill)) {
      return format("corrupt JPEG: more than %d fill bytes before markers (the marker at byte %zu "
                    "passes them)", kMaxJpegFill, at);
    }
    if (++markers > kMaxJpegMarkers) {
      return format("corrupt JPEG: more than %d markers (the marker at byte %zu is one too many)",
                    kMaxJpegMarkers, at);
    }
    const uint32_t m = d[pos++];
    if (m == 0xD9) {
      if (!scan) return format("corrupt JPEG: end-of-image marker at byte %zu before any scan", at);
      out->scans = scans;
      return {};
    }
    // RSTn and TEM have no segment. libjpeg steps over them anywhere, but before the first scan
    // DALI's parser refuses a restart marker ("Invalid marker") and Pillow's a TEM, so there they
    // are refused, as stray bytes are: a file must not pass on one backend and fail on another.
    const bool bare = (m >= 0xD0 && m <= 0xD7) || m == 0x01;
    if (bare && scan) continue;
    if (bare || m == 0x00 || m == 0xD8) {
      return format("corrupt JPEG: unexpected marker 0xFF%02X at byte %zu", m, at);
    }
    if (n - pos < 2) return jpeg_ends_early(n);
    const uint32_t len = be16(d + pos);
    if (len < 2) return format("corrupt JPEG: the 0xFF%02X segment at byte %zu has length %u", m, at, len);
    if (len > n - pos) {
      return format("truncated JPEG: the 0xFF%02X segment at byte %zu runs past the end of the file "
                    "(%zu bytes)", m, at, n);
    }
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC && !frame) {
      if (len < 8) return format("corrupt JPEG: the frame header at byte %zu has length %u", at, len);
      out->height = int(be16(d + pos + 3));
      out->width = int(be16(d + pos + 5));
      out->components = d[pos + 7];
      if (out->width == 0 || out->height == 0) {
        return format("corrupt JPEG: the frame header claims a %dx%d image", out->width, out->height);
      }
      frame = true;
    }
    pos += len;
    if (m != 0xDA) continue;
    if (!frame) return format("corrupt JPEG: a scan at byte %zu before the frame header", at);
    // Each scan of a progressive JPEG is a pass over every block of the image, whatever its
    // size in the file: without a limit a few hundred kB of tiny scans cost seconds a decode.
    const int most = max_scans(out->width, out->height);
    if (++scans > most) {
      if (most == kMaxScans) {
        return format("corrupt JPEG: more than %d scans (the scan at byte %zu is one too many)",
                      kMaxScans, at);
      }
      return format("corrupt JPEG: more than %d scans for its %dx%d pixels (each a pass over them; the "
                    "scan at byte %zu is one too many)", most, out->width, out->height, at);
    }
    scan = true;
    // Inside entropy-coded data a 0xFF is followed by a stuffed 0x00 or a restart marker
    // (D0-D7); any other byte after it (and after fill bytes) is the marker that ends the scan.
    // Fill bytes before a stuffed 0x00 (FF FF 00) make no marker, so the JPEG standard has no
    // meaning for them: libjpeg's byte-at-a-time reader takes them as one 0xFF of data, its
    // fast path as a marker, decoding the rest of that MCU from zero bits and keeping those
    // coefficients; the decoders would disagree, so the file is refused.
    const size_t data_start = pos;
    for (;;) {
      const void* ff = pos < n ? std::memchr(d + pos, 0xFF, n - pos) : nullptr;
      const size_t first = ff ? size_t(static_cast<const uint8_t*>(ff) - d) : n;
      size_t q = first + 1;
      while (q < n && d[q] == 0xFF) ++q;
      if (q >= n) {
        return format("truncated JPEG: no end-of-image marker (the scan data from byte %zu runs "
                      "to the end of the file, %zu bytes)", data_start, n);
      }
      if (d[q] == 0x00 && q > first + 1) {
        return format("corrupt JPEG: fill bytes before a stuffed zero (0xFF 0xFF ... 0x00) at "
                      "byte %zu of the scan data", first);
      }
      if (d[q] == 0x00 || (d[q] >= 0xD0 && d[q] <= 0xD7)) {
        pos = q + 1;
        continue;
      }
      pos = q - 1;  // the 0xFF before the marker: the outer loop reads the marker
      break;
    }
  }
}

// A chunk's type as text when it is 4 ASCII letters (all real ones are), else in hex.
std::string chunk_name(const uint8_t* p) {
  for (int i = 0; i < 4; ++i) {
    if (!((p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= 'a' && p[i] <= 'z'))) {
      return format("0x%08X", be32(p));
    }
  }
  return std::string(reinterpret_cast<const char*>(p), 4);
}

// From the signature through every chunk (length, type, data, CRC: the length must fit in the
// file), at most kMaxPngChunks of them, kMaxPngTexts zTXt and iTXt and one iCCP, to IEND. The
// first chunk must be the 13-byte IHDR, which gives the size, and the only IHDR. CRCs are not
// checked: Pillow decodes a PNG whole, so a corrupt one fails the same way for every crop.
std::string walk_png(const ByteSpan& src, ImageStructure* out) {
  const uint8_t* d = src.data;
  const size_t n = src.size;
  int chunks = 0, texts = 0;
  bool profile = false;
  for (size_t pos = 8;;) {
    if (n - pos < 8) {
      return format("truncated PNG: no IEND chunk (the file ends after %zu bytes)", n);
    }
    if (++chunks > kMaxPngChunks) {
      return format("corrupt PNG: more than %d chunks (the chunk at byte %zu is one too many)",
                    kMaxPngChunks, pos);
    }
    const uint32_t len = be32(d + pos);
    const std::string type = chunk_name(d + pos + 4);
    if (uint64_t(len) + 12 > n - pos) {
      return format("truncated PNG: the %s chunk at byte %zu runs past the end of the file "
                    "(%zu bytes)", type.c_str(), pos, n);
    }
    if (pos == 8) {
      if (type != "IHDR" || len != 13) {
        return format("corrupt PNG: the first chunk is %s of %u bytes, not a 13-byte IHDR",
                      type.c_str(), len);
      }
      const uint32_t w = be32(d + pos + 8), h = be32(d + pos + 12);
      if (w == 0 || h == 0 || w > 0x7FFFFFFFu || h > 0x7FFFFFFFu) {
        return format("corrupt PNG: the header claims a %ux%u image", w, h);
      }
      out->width = int(w);
      out->height = int(h);
    }
    // Pillow takes each IHDR's size over the last, so a second one would decode at a size
    // neither the pixel limit nor the crop was planned for; libpng refuses it, and so does this.
    if (type == "IHDR" && pos != 8) {
      return format("corrupt PNG: a second IHDR chunk at byte %zu (a PNG has one header)", pos);
    }
    if (type == "IEND") return {};
    // Pillow inflates every iCCP chunk's profile (up to 1 MiB each); a PNG holds one at most.
    if (type == "iCCP" && profile) {
      return format("corrupt PNG: a second iCCP chunk at byte %zu (a PNG holds one colour profile)", pos);
    }
    profile = profile || type == "iCCP";
    if ((type == "zTXt" || type == "iTXt") && ++texts > kMaxPngTexts) {
      return format("corrupt PNG: more than %d zTXt and iTXt chunks (the last at byte %zu)", kMaxPngTexts, pos);
    }
    pos += 12 + size_t(len);
  }
}

}  // namespace

std::string check_structure(const ByteSpan& src, ImageStructure* out) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  *out = ImageStructure{};
  const uint8_t* d = src.data;
  if (src.size == 0) return "empty file";
  if (src.size >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) {
    out->kind = kImageJpeg;
    return walk_jpeg(src, out);
  }
  if (src.size >= 8 && std::memcmp(d, kPng, 8) == 0) {
    out->kind = kImagePng;
    return walk_png(src, out);
  }
  return {};
}

}  // namespace fastdata
