// JPEG_INTERNALS brings in jpegint.h (the module interfaces: struct jpeg_entropy_decoder, the
// master's crop columns) and jerror.h (the message codes). It must come before any include of
// jpeglib.h.
#define JPEG_INTERNALS
#include "entropy.h"

#if __has_include(<jpegint.h>)

#include <pthread.h>
#include <unistd.h>  // getentropy

#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>

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

// ---------------------------------------------------------------------------- the index

// The decoder's state at an MCU's first bit: where it is in the unstuffed entropy-coded data,
// and the last DC value of each component (the next block's DC is a difference from it).
struct Checkpoint {
  uint32_t bit;
  int16_t dc[3];
};

// A file's checkpoints are found by a 128-bit keyed hash of its bytes (the decoder's private
// copy: decode.cpp) and their count, so that a file changed in any way is a new file and two paths
// to one file share one. The hash is SipHash-1-3 (Aumasson and Bernstein's keyed PRF; the
// 128-bit output of the reference design), keyed by 16 bytes the operating system draws once per
// process (forked children keep them): no input can choose its key, or another file's, without
// that secret. An unkeyed hash would let a crafted file take another file's checkpoints: one
// chosen block after the end-of-image marker (bytes there are accepted) sets any unkeyed,
// invertible hash to any value. Written here, as CPython's and Rust's copies of SipHash are not
// callable from C++: one pass over the file's bytes at a few GB/s, a few percent of a decode.
struct Key {
  uint64_t h0, h1, size;
  bool operator==(const Key& o) const { return h0 == o.h0 && h1 == o.h1 && size == o.size; }
};
struct KeyHash {
  size_t operator()(const Key& k) const { return size_t(k.h0); }
};

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64): SipHash reads LE words
  return v;
}
inline uint64_t rotl(uint64_t v, int r) { return v << r | v >> (64 - r); }

struct SipKey {
  uint64_t k0, k1;
};

// 16 bytes from getentropy (the kernel's CSPRNG); std::random_device where it is missing.
SipKey process_key() {
  uint64_t k[2] = {0, 0};
  if (getentropy(k, sizeof k) != 0) {
    std::random_device rd;
    for (uint64_t& w : k) w = uint64_t(rd()) << 32 | rd();
  }
  return {k[0], k[1]};
}

Key keyed_hash(const SipKey& key, const uint8_t* d, size_t n) {
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ull, v1 = key.k1 ^ 0x646f72616e646f6dull ^ 0xee,
           v2 = key.k0 ^ 0x6c7967656e657261ull, v3 = key.k1 ^ 0x7465646279746573ull;
  auto round = [&] {
    v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);
    v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);
  };
  auto absorb = [&](uint64_t m) {
    v3 ^= m;
    round();  // c = 1
    v0 ^= m;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) absorb(load64(d + i));
  uint64_t last = uint64_t(n) << 56;
  for (size_t j = 0; i + j < n; ++j) last |= uint64_t(d[i + j]) << (8 * j);
  absorb(last);
  v2 ^= 0xee;
  round(), round(), round();  // d = 3
  const uint64_t h0 = v0 ^ v1 ^ v2 ^ v3;
  v1 ^= 0xdd;
  round(), round(), round();
  return Key{h0, v0 ^ v1 ^ v2 ^ v3, uint64_t(n)};
}

}  // namespace

struct EntropyIndex {
  std::vector<Checkpoint> at;  // at[i]: the state at MCU i's first bit; MCUs [0, size - 1) decoded
  uint32_t mcus = 0;           // the scan's MCUs
  uint64_t nbits = 0;          // bits of its entropy-coded data
  bool whole = false;          // every MCU decoded without error
  size_t bytes() const { return sizeof(*this) + at.capacity() * sizeof(Checkpoint) + 64; }
};

namespace {

// Checkpoints take 12 bytes an MCU (a 418x314 4:2:0 photo: 540 MCUs, 6.5 kB); past this many
// bytes a process keeps no more files' checkpoints, and decodes the rest as before.
constexpr size_t kIndexBudget = size_t(256) << 20;

// The process's checkpoints by file content. A mutex taken twice a decode (find, keep); fork
// waits for it (pthread_atfork), so that a child never starts with it held by a decode thread
// of the parent's that it does not have.
class Store {
 public:
  static Store& get() {
    static Store* store = [] {
      auto* s = new Store;  // never destroyed: decode threads may outlive static destructors
      pthread_atfork([] { get().mu_.lock(); }, [] { get().mu_.unlock(); },
                     [] { get().mu_.unlock(); });
      return s;
    }();
    return *store;
  }

  // The process's hash key (process_key): drawn when the store is made, before any decode.
  const SipKey& key() const { return key_; }

  std::shared_ptr<const EntropyIndex> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }

  // Keeps `index` for `key` unless one as long is kept, or a new file would pass the budget.
  void keep(const Key& key, std::shared_ptr<const EntropyIndex> index) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    if (it == map_.end()) {
      if (bytes_ + index->bytes() > kIndexBudget) return;
      bytes_ += index->bytes();
      map_.emplace(key, std::move(index));
      return;
    }
    if (it->second->at.size() >= index->at.size()) return;
    bytes_ += index->bytes() - it->second->bytes();
    it->second = std::move(index);
  }

  size_t bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  const SipKey key_ = process_key();
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const EntropyIndex>, KeyHash> map_;
  size_t bytes_ = 0;
};

// A decode_mcu can take 16 + 15 bits a coefficient, 64 coefficients a block, 10 blocks an MCU:
// about 2.5 kB. The unstuffed data is followed by this many zero bytes, so that the reader never
// checks for its end inside an MCU; the bit position is checked against the data's length after
// each MCU (past it: libjpeg's "premature end of data segment").
constexpr size_t kPad = 4096;

inline uint64_t load_be64(const uint8_t* p) { return __builtin_bswap64(load64(p)); }

[[noreturn]] void fail_with(j_decompress_ptr cinfo, int code, int p0 = 0, int p1 = 0) {
  cinfo->err->msg_code = code;
  cinfo->err->msg_parm.i[0] = p0;
  cinfo->err->msg_parm.i[1] = p1;
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
  // The checkpoints: cps[0 .. ncps) are known, from `found` (kept by an earlier decode of these
  // bytes) and from this decode (`known`, when it extends them).
  Key key{};
  std::shared_ptr<const EntropyIndex> found;
  std::vector<Checkpoint> known;
  const Checkpoint* cps = nullptr;
  size_t ncps = 0;
  bool recording = false, fits = true;
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

  void jump(const Checkpoint& c, int64_t mcu) {
    // Never past the data, whatever a checkpoint holds: a read stays inside the buffer.
    if (c.bit > nbits) fail_with(cinfo, JWRN_HIT_MARKER);
    p = data.data() + (c.bit >> 3);
    buf = load_be64(p) << (c.bit & 7);
    p += 7;
    bits = 56 - int(c.bit & 7);
    for (int ci = 0; ci < 3; ++ci) last_dc[ci] = c.dc[ci];
    at = mcu;
  }

  // After MCU i - 1 was decoded from the frontier: its successor's state is a new checkpoint.
  void record(uint32_t i) {
    if (!recording || !fits || i != ncps) return;
    Checkpoint c{uint32_t(position()), {}};
    for (int ci = 0; ci < 3; ++ci) {
      if (last_dc[ci] < INT16_MIN || last_dc[ci] > INT16_MAX) {
        fits = false;  // only corrupt data gets here; such a file keeps no further checkpoints
        return;
      }
      c.dc[ci] = int16_t(last_dc[ci]);
    }
    known.push_back(c);  // reserved: cps stays valid
    ncps = known.size();
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
  // has fails as libjpeg does when it reaches the marker, and one with whole bytes left after
  // its MCUs as libjpeg does when it skips them to find the marker ("extraneous bytes").
  template <bool Store>
  void step(JBLOCKROW* out, uint32_t j) {
    decode<Store>(out);
    at = int64_t(j) + 1;
    if (interval != 0 && (j + 1) % interval == 0 && j + 1 < mcus) {
      const uint32_t k = (j + 1) / interval, start = seg[k];
      const uint64_t used = (position() + 7) / 8;
      if (used > start) fail_with(cinfo, JWRN_HIT_MARKER);
      if (used < start) fail_with(cinfo, JWRN_EXTRANEOUS_DATA, int(start - used), 0xD0 + int((k - 1) & 7));
      jump(Checkpoint{start * 8, {0, 0, 0}}, at);
    }
    record(j + 1);
  }

  // Puts the reader at MCU i's first bit: a jump to its checkpoint, or past the frontier, from
  // the frontier on, each MCU decoded and its successor's checkpoint noted.
  void seek(uint32_t i) {
    if (at == int64_t(i)) return;
    if (i < ncps) {
      jump(cps[i], i);
      return;
    }
    const uint32_t frontier = uint32_t(ncps - 1);
    if (at < int64_t(frontier) || at > int64_t(i)) jump(cps[frontier], frontier);
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
  if (s.nbits >= (uint64_t(1) << 32)) return false;  // checkpoints hold 32-bit positions
  s.data.resize(s.data.size() + kPad, 0);

  // `file` is the decoder's private copy (decode.cpp): the bytes hashed are the bytes decoded.
  Store& store = Store::get();
  s.key = keyed_hash(store.key(), file.data, file.size);
  s.found = store.find(s.key);
  if (s.found && (s.found->mcus != s.mcus || s.found->nbits != s.nbits ||
                  s.found->at.size() > size_t(s.mcus) + 1)) {
    s.found.reset();  // not these bytes' (a 128-bit keyed collision: not expected to happen)
  }
  s.fits = true;
  s.known.clear();
  if (s.found && s.found->whole) {
    s.recording = false;
    s.cps = s.found->at.data();
    s.ncps = s.found->at.size();
  } else {
    s.recording = true;
    s.known.reserve(size_t(s.mcus) + 1);
    if (s.found) {
      s.known.assign(s.found->at.begin(), s.found->at.end());
    } else {
      s.known.push_back(Checkpoint{0, {0, 0, 0}});
    }
    s.cps = s.known.data();
    s.ncps = s.known.size();
  }
  s.next = 0;
  s.at = -1;
  s.cinfo = cinfo;
  cinfo->client_data = &s;
  cinfo->entropy->decode_mcu = decode_mcu_hook;
  return true;
}

bool EntropyDecoder::proven_whole() const { return s_->cinfo && s_->found && s_->found->whole; }

void EntropyDecoder::decode_rest(j_decompress_ptr cinfo) {
  State& s = *s_;
  if (s.cinfo != cinfo || s.mcus == 0) return;
  s.seek(s.mcus);  // decodes up to the last MCU's end (checkpoint mcus: one past the last)
}

void EntropyDecoder::detach(bool ok) {
  State& s = *s_;
  if (s.cinfo == nullptr) return;
  s.cinfo->client_data = nullptr;
  s.cinfo = nullptr;
  if (!ok || !s.recording || !s.fits || (s.found && s.found->at.size() >= s.known.size())) {
    s.found.reset();
    return;
  }
  auto index = std::make_shared<EntropyIndex>();
  index->at.assign(s.known.begin(), s.known.end());
  index->mcus = s.mcus;
  index->nbits = s.nbits;
  index->whole = s.known.size() == size_t(s.mcus) + 1;
  Store::get().keep(s.key, std::move(index));
  s.found.reset();
}

size_t EntropyDecoder::scratch_bytes() const {
  const State& s = *s_;
  return s.data.capacity() + s.known.capacity() * sizeof(Checkpoint) +
         s.seg.capacity() * sizeof(uint32_t);
}

void EntropyDecoder::trim(size_t keep) {
  State& s = *s_;
  if (s.data.capacity() > keep) std::vector<uint8_t>().swap(s.data);
  if (s.known.capacity() * sizeof(Checkpoint) > keep) std::vector<Checkpoint>().swap(s.known);
  if (s.seg.capacity() * sizeof(uint32_t) > keep) std::vector<uint32_t>().swap(s.seg);
}

size_t entropy_index_bytes() { return Store::get().bytes(); }

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
size_t entropy_index_bytes() { return 0; }
}  // namespace fastdata

#endif
