// JPEG_INTERNALS brings in jpegint.h (the module interfaces: struct jpeg_entropy_decoder, the
// master's crop columns) and jerror.h (the message codes). It must come before any include of
// jpeglib.h.
#define JPEG_INTERNALS
#include "entropy.h"

#if __has_include(<jpegint.h>)

#include <algorithm>
#include <cstring>

#include "index.h"

namespace fastdata {
namespace {

// ---------------------------------------------------------------------------- Huffman tables

constexpr int kFastBits = 9;  // codes (and AC coefficients) up to this many bits: one lookup

// fast[] entries: 0 for a code longer than kFastBits; else bits 0-4 the bits it takes, and
// either (kCoef clear) the symbol in bits 8-15, or (kCoef set: a whole AC coefficient, code and
// value bits within kFastBits) the zero run in bits 8-11 and the value in bits 16-31.
constexpr int32_t kCoef = 1 << 5;

struct HuffmanTable {
  int32_t fast[1 << kFastBits];
  int32_t maxcode[17];    // the largest code of each length; -1 for none
  int32_t valoffset[17];  // symbol index = code + valoffset[length]
  uint8_t vals[256];
};

inline int32_t extend(uint32_t v, int s) {  // the value of s bits v (JPEG's sign convention)
  return int32_t(v) + ((int32_t(v) - (1 << (s - 1))) >> 31 & int32_t((~0u << s) + 1));
}

// From a DHT segment's counts and symbols, already checked by libjpeg (jpeg_make_d_derived_tbl
// refuses a table whose codes overflow their lengths) before this runs.
void build_table(const JHUFF_TBL& t, bool ac, HuffmanTable* out) {
  std::memset(out->fast, 0, sizeof out->fast);
  std::memcpy(out->vals, t.huffval, sizeof out->vals);
  int32_t code = 0, k = 0;
  for (int len = 1; len <= 16; ++len) {
    const int n = t.bits[len];
    out->valoffset[len] = k - code;
    out->maxcode[len] = n ? code + n - 1 : -1;
    for (int j = 0; j < n; ++j, ++code, ++k) {
      if (len > kFastBits) continue;
      const int sym = t.huffval[k];
      const int shift = kFastBits - len;
      for (int32_t f = code << shift; f < (code + 1) << shift; ++f) {
        int32_t e = len | sym << 8;
        const int run = sym >> 4, size = sym & 15;
        if (ac && size && len + size <= kFastBits) {
          const uint32_t v = uint32_t(f >> (shift - size)) & ((1u << size) - 1);
          e = (len + size) | kCoef | run << 8 | int32_t(uint32_t(extend(v, size)) << 16);
        }
        out->fast[f] = e;
      }
    }
    code <<= 1;
  }
}

// Zigzag position -> natural position, with 16 entries of 63 past the end: a corrupt run can
// carry k to 78, and libjpeg writes such a coefficient to position 63 (its own table's padding).
constexpr int kNatural[80] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

// ---------------------------------------------------------------------------- checkpoints

// The decoder's state at an MCU's first bit: where it is in the unstuffed entropy-coded data,
// and the last DC value of each component (the next block's DC is a difference from it).
struct Checkpoint {
  uint32_t bit;
  int32_t dc[3];
};

// In the index (index.h), 8 bytes: the bit position in bits 0-30 and each DC value + 1024 in 11
// bits above. An 8-bit baseline JPEG's DC coefficients lie in [-1024, 1023]; a file whose
// decode meets one outside (only corrupt data does) is not indexed, nor one of 2^31 bits.
constexpr int32_t kDcBias = 1024;

inline bool packable(const int32_t* dc) {
  for (int ci = 0; ci < 3; ++ci) {
    if (dc[ci] < -kDcBias || dc[ci] >= kDcBias) return false;
  }
  return true;
}

inline uint64_t pack(const Checkpoint& c) {
  uint64_t v = c.bit & 0x7FFFFFFFu;
  for (int ci = 0; ci < 3; ++ci) v |= uint64_t(uint32_t(c.dc[ci] + kDcBias) & 0x7FF) << (31 + 11 * ci);
  return v;
}

inline Checkpoint unpack(uint64_t v) {
  Checkpoint c{uint32_t(v & 0x7FFFFFFFu), {}};
  for (int ci = 0; ci < 3; ++ci) c.dc[ci] = int32_t((v >> (31 + 11 * ci)) & 0x7FF) - kDcBias;
  return c;
}

// Which MCUs have a checkpoint: at most `cap` of them (the index's bound a file), on a grid of
// every rstep-th MCU row, at `kper` columns evenly spaced (every cstep MCUs) in each such row.
// A window's decode then Huffman-decodes from the checkpoint before each of its rows' first
// MCU: on a photo of 22 MCU rows and a cap of 64, two checkpoints a row, so a row's decode
// starts at most half a row before the window.
struct Grid {
  uint32_t per_row = 1, rstep = 1, cstep = 1, kper = 1, count = 1;

  void set(uint32_t per_row_, uint32_t rows, uint32_t cap) {
    per_row = std::max(per_row_, 1u);
    rows = std::max(rows, 1u);
    rstep = (rows + cap - 1) / cap;
    const uint32_t rows_with = (rows + rstep - 1) / rstep;
    const uint32_t k = std::max(1u, std::min(per_row, cap / rows_with));
    cstep = (per_row + k - 1) / k;
    kper = (per_row + cstep - 1) / cstep;
    count = rows_with * kper;
  }
  // The MCU of checkpoint q.
  uint32_t mcu(uint32_t q) const { return (q / kper) * rstep * per_row + (q % kper) * cstep; }
  // The last checkpoint at or before MCU i.
  uint32_t before(uint32_t i) const {
    const uint32_t r = i / per_row, a = r / rstep;
    return a * kper + (a * rstep == r ? (i % per_row) / cstep : kper - 1);
  }
};

// A decode_mcu can take 16 + 15 bits a coefficient, 64 coefficients a block, 10 blocks an MCU:
// about 2.5 kB. The unstuffed data is followed by this many zero bytes, so that the reader never
// checks for its end inside an MCU; the bit position is checked against the data's length after
// each MCU (past it: libjpeg's "premature end of data segment").
constexpr size_t kPad = 4096;

inline uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);  // little-endian hosts only (x86-64, aarch64)
}

[[noreturn]] void fail_with(j_decompress_ptr cinfo, int code) {
  cinfo->err->msg_code = code;
  (*cinfo->err->error_exit)(reinterpret_cast<j_common_ptr>(cinfo));
  std::abort();  // error_exit does not return (libjpeg's contract)
}

}  // namespace

struct EntropyDecoder::State {
  // The scan.
  std::vector<uint8_t> data;  // entropy-coded bytes with the stuffing removed, then kPad zeros
  uint64_t nbits = 0;         // bits of data before the padding
  int blocks = 0;
  int comp[D_MAX_BLOCKS_IN_MCU] = {};
  const HuffmanTable* dc[D_MAX_BLOCKS_IN_MCU] = {};
  const HuffmanTable* ac[D_MAX_BLOCKS_IN_MCU] = {};
  uint32_t mcus = 0, per_row = 0, first_col = 0, last_col = 0;
  uint32_t interval = 0;      // MCUs a restart segment, 0 for none
  std::vector<uint32_t> seg;  // where each restart segment starts in data (bytes)
  // The reader: buf holds `bits` unread bits at its top; p is the next byte to load.
  const uint8_t* p = nullptr;
  uint64_t buf = 0;
  int bits = 0;
  int32_t last_dc[4] = {};
  uint32_t next = 0;  // the MCU the next decode_mcu call is for
  int64_t at = -1;    // the MCU whose first bit the reader is at, -1 for none
  // The checkpoints (packed), on `grid`: found in the index for these bytes (`found`), or
  // recorded by this decode, which reads the scan from its start (cps[0 .. size)).
  Index index;  // the index these bytes were looked up in, and are published to
  IndexKey key{};
  Grid grid;
  std::vector<uint64_t> cps;
  bool found = false, fits = true;
  uint32_t nbytes = 0;
  j_decompress_ptr cinfo = nullptr;
  // Tables built for earlier images, by their DHT contents: most datasets use one set. An
  // image uses at most 6 (a DC and an AC table for each of 3 components); the slots it uses
  // carry its stamp, so that building one of its tables never replaces another of them.
  struct Cached {
    uint64_t stamp = 0;
    bool ac = false;
    UINT8 bits[17], vals[256];
    HuffmanTable table;
  };
  Cached cache[8];
  int cache_next = 0;
  uint64_t image = 0;  // the stamp of the image being attached

  const HuffmanTable* table(const JHUFF_TBL* t, bool is_ac) {
    for (Cached& c : cache) {
      if (c.stamp != 0 && c.ac == is_ac && std::memcmp(c.bits, t->bits, sizeof c.bits) == 0 &&
          std::memcmp(c.vals, t->huffval, sizeof c.vals) == 0) {
        c.stamp = image;
        return &c.table;
      }
    }
    while (cache[cache_next].stamp == image) cache_next = (cache_next + 1) % 8;
    Cached& c = cache[cache_next];
    cache_next = (cache_next + 1) % 8;
    c.stamp = image;
    c.ac = is_ac;
    std::memcpy(c.bits, t->bits, sizeof c.bits);
    std::memcpy(c.vals, t->huffval, sizeof c.vals);
    build_table(*t, is_ac, &c.table);
    return &c.table;
  }

  uint64_t position() const { return uint64_t(p - data.data()) * 8 - uint64_t(bits); }

  void jump(const Checkpoint& c, uint32_t mcu) {
    // Never past the data, whatever a checkpoint holds: a read stays inside the buffer.
    if (c.bit > nbits) fail_with(cinfo, JWRN_HIT_MARKER);
    p = data.data() + (c.bit >> 3);
    buf = load_be64(p) << (c.bit & 7);
    p += 7;
    bits = 56 - int(c.bit & 7);
    for (int ci = 0; ci < 3; ++ci) last_dc[ci] = c.dc[ci];
    at = mcu;
  }

  // After MCU i - 1 was decoded: the state at MCU i is recorded when i is the grid's next.
  void record(uint32_t i) {
    if (found || !fits || cps.size() >= grid.count || i != grid.mcu(uint32_t(cps.size()))) return;
    if (!packable(last_dc) || position() >= (uint64_t(1) << 31)) {
      fits = false;  // only corrupt data gets here; such a file is not indexed
      return;
    }
    cps.push_back(pack(Checkpoint{uint32_t(position()), {last_dc[0], last_dc[1], last_dc[2]}}));
  }

  // Decodes the next MCU's blocks into out (or nowhere), as libjpeg-turbo's decode_mcu does.
  template <bool Store>
  void decode(JBLOCKROW* out) {
    const uint8_t* q = p;
    uint64_t b = buf;
    int n = bits;
    auto refill = [&] {
      b |= load_be64(q) >> n;
      q += (63 - n) >> 3;
      n |= 56;
    };
    auto consume = [&](int len) {
      b <<= len;
      n -= len;
    };
    // A code longer than kFastBits (fast[] gave 0), of up to 16 bits; n >= 16.
    auto slow = [&](const HuffmanTable& t) -> int {
      const int32_t code = int32_t(b >> 48);
      int len = kFastBits + 1;
      while (len <= 16 && (code >> (16 - len)) > t.maxcode[len]) ++len;
      if (len > 16) fail_with(cinfo, JWRN_HUFF_BAD_CODE);
      const int sym = t.vals[((code >> (16 - len)) + t.valoffset[len]) & 0xFF];
      consume(len);
      return sym;
    };
    // The symbol of the code at the reader, e its fast[] entry.
    auto symbol = [&](const HuffmanTable& t, int32_t e) -> int {
      if (e == 0) return slow(t);
      consume(e & 31);
      return (e >> 8) & 0xFF;
    };
    auto take = [&](int s) -> uint32_t {  // s in 1..15 bits
      const uint32_t v = uint32_t(b >> (64 - s));
      consume(s);
      return v;
    };
    for (int k0 = 0; k0 < blocks; ++k0) {
      JCOEF* block = Store ? out[k0][0] : nullptr;
      const HuffmanTable& act = *ac[k0];
      refill();
      const int s = symbol(*dc[k0], dc[k0]->fast[b >> (64 - kFastBits)]);
      const int32_t diff = s ? extend(take(s), s) : 0;
      int32_t& last = last_dc[comp[k0]];
      last = int32_t(uint32_t(last) + uint32_t(diff));  // wraps as libjpeg's does on bad data
      if (Store) block[0] = JCOEF(last);
      for (int k = 1; k < 64; ++k) {
        if (n < 32) refill();
        const int32_t e = act.fast[b >> (64 - kFastBits)];
        if (e & kCoef) {
          consume(e & 31);
          k += (e >> 8) & 15;
          if (Store) block[kNatural[k]] = JCOEF(e >> 16);
          continue;
        }
        const int rs = symbol(act, e);
        const int r = rs >> 4, size = rs & 15;
        if (size) {
          k += r;
          const int32_t v = extend(take(size), size);
          if (Store) block[kNatural[k]] = JCOEF(v);
        } else {
          if (r != 15) break;
          k += 15;
        }
      }
    }
    p = q;
    buf = b;
    bits = n;
    if (position() > nbits) fail_with(cinfo, JWRN_HIT_MARKER);
  }

  // Decodes MCU j, the reader at its first bit, and leaves the reader at MCU j + 1's: past a
  // restart marker, at the next segment's first byte with the DC predictors reset (the bits
  // left in the segment's last byte are padding). A segment whose MCUs need more bits than it
  // has fails as libjpeg does when it reaches the marker; whole bytes left after its MCUs are
  // skipped, as libjpeg skips them to find the marker (its "extraneous bytes" warning, which
  // decode.cpp lets pass).
  template <bool Store>
  void step(JBLOCKROW* out, uint32_t j) {
    decode<Store>(out);
    at = int64_t(j) + 1;
    if (interval != 0 && (j + 1) % interval == 0 && j + 1 < mcus) {
      const uint32_t k = (j + 1) / interval, start = seg[k];
      const uint64_t used = (position() + 7) / 8;
      if (used > start) fail_with(cinfo, JWRN_HIT_MARKER);
      jump(Checkpoint{start * 8, {0, 0, 0}}, uint32_t(at));
    }
    record(j + 1);
  }

  // Puts the reader at MCU i's first bit (i <= mcus): with checkpoints found, from the last
  // checkpoint or restart marker at or before i, unless the reader is between it and i; else
  // from where the reader is (libjpeg asks for MCUs in order), recording the grid's states on
  // the way. The MCUs between are Huffman-decoded only.
  void seek(uint32_t i) {
    if (at == int64_t(i)) return;
    if (found) {
      const uint32_t last = std::min(i, mcus - 1);
      const uint32_t q = grid.before(last);
      uint32_t start = grid.mcu(q);
      Checkpoint c = unpack(cps[q]);
      if (interval != 0 && last / interval * interval > start) {
        start = last / interval * interval;
        c = Checkpoint{seg[start / interval] * 8, {0, 0, 0}};
      }
      if (at < int64_t(start) || at > int64_t(i)) jump(c, start);
    } else if (at < 0 || at > int64_t(i)) {
      jump(Checkpoint{0, {0, 0, 0}}, 0);
    }
    for (uint32_t j = uint32_t(at); j < i; ++j) step<false>(nullptr, j);
  }
};

namespace {

boolean decode_mcu_hook(j_decompress_ptr cinfo, JBLOCKROW* out) {
  auto& s = *static_cast<EntropyDecoder::State*>(cinfo->client_data);
  const uint32_t i = s.next++;
  if (i >= s.mcus) return TRUE;  // not reached: libjpeg asks for each MCU once
  const uint32_t col = i % s.per_row;
  if (out == nullptr || col < s.first_col || col > s.last_col) return TRUE;
  s.seek(i);
  s.step<true>(out, i);
  return TRUE;
}

}  // namespace

EntropyDecoder::EntropyDecoder() : s_(new State) {}
EntropyDecoder::~EntropyDecoder() = default;

bool EntropyDecoder::attach(j_decompress_ptr cinfo, const ByteSpan& file) {
  State& s = *s_;
  s.cinfo = nullptr;
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      jpeg_has_multiple_scans(cinfo) ||
      cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > 3 ||
      cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 || cinfo->Al != 0 ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU) {
    return false;
  }
  s.blocks = cinfo->blocks_in_MCU;
  ++s.image;
  for (int b = 0; b < s.blocks; ++b) {
    const int ci = cinfo->MCU_membership[b];
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    const JHUFF_TBL* dct = cinfo->dc_huff_tbl_ptrs[comp->dc_tbl_no];
    const JHUFF_TBL* act = cinfo->ac_huff_tbl_ptrs[comp->ac_tbl_no];
    if (dct == nullptr || act == nullptr) return false;  // libjpeg has refused it already
    s.comp[b] = ci;
    s.dc[b] = s.table(dct, false);
    s.ac[b] = s.table(act, true);
  }
  s.per_row = cinfo->MCUs_per_row;
  s.mcus = cinfo->MCUs_per_row * cinfo->MCU_rows_in_scan;
  s.first_col = cinfo->master->first_iMCU_col;
  s.last_col = cinfo->master->last_iMCU_col;

  // The scan's data: from where libjpeg stopped reading (just past the SOS segment) to the
  // marker that ends it, the 0x00 after each data 0xFF dropped (fill 0xFFs before it too, as
  // libjpeg does). With a restart interval, the scan is segments of that many MCUs, each but
  // the last followed by its restart marker, RST0 to RST7 in turn: seg[k] is where segment k
  // starts in the data. Markers missing or out of turn leave the image to libjpeg's decoder
  // and its rules for resynchronising.
  s.interval = cinfo->restart_interval;
  const uint32_t segments = s.interval ? (s.mcus + s.interval - 1) / s.interval : 1;
  s.seg.assign(1, 0);
  const uint8_t* q = cinfo->src->next_input_byte;
  const uint8_t* end = file.data + file.size;
  if (q < file.data || q > end) return false;
  s.data.clear();
  s.data.reserve(size_t(end - q) + kPad);
  while (q < end) {
    const auto* ff = static_cast<const uint8_t*>(std::memchr(q, 0xFF, size_t(end - q)));
    if (ff == nullptr) {
      s.data.insert(s.data.end(), q, end);
      break;
    }
    s.data.insert(s.data.end(), q, ff);
    const uint8_t* m = ff + 1;
    while (m < end && *m == 0xFF) ++m;
    if (m < end && *m == 0x00) {
      s.data.push_back(0xFF);
      q = m + 1;
      continue;
    }
    if (m < end && s.seg.size() < segments && *m == 0xD0 + ((s.seg.size() - 1) & 7)) {
      s.seg.push_back(uint32_t(s.data.size()));
      q = m + 1;
      continue;
    }
    break;  // any other marker: the scan's data ends before ff
  }
  if (s.seg.size() != segments) return false;
  s.nbits = uint64_t(s.data.size()) * 8;
  if (s.nbits >= (uint64_t(1) << 31)) return false;  // checkpoints hold 31-bit positions
  s.data.resize(s.data.size() + kPad, 0);

  // `file` is the decoder's private copy (decode.cpp): the bytes hashed are the bytes decoded.
  s.index = current_index();
  s.nbytes = uint32_t(s.nbits / 8);
  s.key = s.index.key_of(file.data, file.size);
  s.grid.set(s.per_row, cinfo->MCU_rows_in_scan, s.index.max_checkpoints());
  s.found = s.index.find(s.key, s.mcus, s.nbytes, &s.cps) && s.cps.size() == s.grid.count &&
            s.cps[0] == pack(Checkpoint{0, {0, 0, 0}});
  s.fits = !s.found && !s.index.full();
  if (!s.found) {
    s.cps.clear();
    s.cps.reserve(s.grid.count);
    s.cps.push_back(pack(Checkpoint{0, {0, 0, 0}}));
  }
  s.next = 0;
  s.at = -1;
  s.cinfo = cinfo;
  cinfo->client_data = &s;
  cinfo->entropy->decode_mcu = decode_mcu_hook;
  return true;
}

bool EntropyDecoder::proven_whole() const { return s_->cinfo && s_->found; }


void EntropyDecoder::decode_rest(j_decompress_ptr cinfo) {
  State& s = *s_;
  if (s.cinfo != cinfo || s.mcus == 0) return;
  s.seek(s.mcus);  // decodes up to the last MCU's end
}

void EntropyDecoder::detach(bool ok) {
  State& s = *s_;
  if (s.cinfo == nullptr) return;
  s.cinfo->client_data = nullptr;
  s.cinfo = nullptr;
  if (ok && !s.found && s.fits && s.at == int64_t(s.mcus) && s.cps.size() == s.grid.count) {
    s.index.add(s.key, s.mcus, s.nbytes, s.cps.data(), s.grid.count);
  }
}

size_t EntropyDecoder::scratch_bytes() const {
  const State& s = *s_;
  return s.data.capacity() + s.cps.capacity() * sizeof(uint64_t) +
         s.seg.capacity() * sizeof(uint32_t);
}

void EntropyDecoder::trim(size_t keep) {
  State& s = *s_;
  if (s.data.capacity() > keep) std::vector<uint8_t>().swap(s.data);
  if (s.cps.capacity() * sizeof(uint64_t) > keep) std::vector<uint64_t>().swap(s.cps);
  if (s.seg.capacity() * sizeof(uint32_t) > keep) std::vector<uint32_t>().swap(s.seg);
}


}  // namespace fastdata

#else  // a libjpeg without its internal header: libjpeg's own entropy decoder, no index

namespace fastdata {
struct EntropyDecoder::State {};
EntropyDecoder::EntropyDecoder() = default;
EntropyDecoder::~EntropyDecoder() = default;
bool EntropyDecoder::attach(j_decompress_ptr, const ByteSpan&) { return false; }
bool EntropyDecoder::proven_whole() const { return false; }
void EntropyDecoder::decode_rest(j_decompress_ptr) {}
void EntropyDecoder::detach(bool) {}
size_t EntropyDecoder::scratch_bytes() const { return 0; }
void EntropyDecoder::trim(size_t) {}
}  // namespace fastdata

#endif
