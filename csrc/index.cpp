#include "index.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>  // getentropy

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

namespace fastdata {
namespace {

// ---------------------------------------------------------------------------- the keyed hash

// SipHash-1-3 with 128-bit output (Aumasson and Bernstein's keyed PRF, the reference design's
// 128-bit variant). An unkeyed hash would let a crafted file take another file's checkpoints:
// one chosen block after the end-of-image marker (bytes there are accepted) sets any unkeyed,
// invertible hash to any value. Written here, as CPython's and Rust's copies of SipHash are not
// callable from C++: one pass over the file's bytes at a few GB/s, a few percent of a decode.
struct SipKey {
  uint64_t k0 = 0, k1 = 0;
};

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64): SipHash reads LE words
  return v;
}
inline uint64_t rotl(uint64_t v, int r) { return v << r | v >> (64 - r); }

// 16 bytes from getentropy (the kernel's CSPRNG); std::random_device where it is missing.
SipKey fresh_key() {
  uint64_t k[2] = {0, 0};
  if (getentropy(k, sizeof k) != 0) {
    std::random_device rd;
    for (uint64_t& w : k) w = uint64_t(rd()) << 32 | rd();
  }
  return {k[0], k[1]};
}

IndexKey siphash(const SipKey& key, const uint8_t* d, size_t n) {
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
  return IndexKey{h0, v0 ^ v1 ^ v2 ^ v3, uint64_t(n)};
}

// ---------------------------------------------------------------------------- the layout

constexpr char kMagic[8] = {'F', 'D', 'J', 'P', 'I', 'D', 'X', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 4096;
// Slots a lookup tries from its home slot (linear probing). At the index's fullest (3/4 of its
// slots) a lookup takes 8.5 probes on average, but with a million files some take a hundred or
// more; 1,024 (16 kB read) bounds the work and loses about no file.
constexpr int kProbes = 1024;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t max_cps;
  uint64_t slots;
  uint64_t arena;
  uint64_t k0, k1;
  uint64_t used;   // atomic: arena bytes handed out (may pass `arena` once it is full)
  uint64_t files;  // atomic: records published
};
static_assert(sizeof(Header) <= kHeaderBytes, "header");

struct Slot {
  uint64_t tag;  // key.h0 | 1; 0: empty
  uint64_t ref;  // 1 + the record's arena offset; 0: not published
};

struct Record {
  uint64_t h0, h1, size;
  uint32_t mcus, nbytes, ncps, pad;
  uint64_t mac;  // keyed hash of the record with mac = 0, and its checkpoints
};
static_assert(sizeof(Record) == 48, "record");

uint64_t load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

}  // namespace

struct Index::Map {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  int fd = -1;  // the file, for fallocate; -1 for an anonymous mapping
  std::string path;
  Header* header = nullptr;
  Slot* slots = nullptr;
  uint8_t* arena = nullptr;
  uint64_t nslots = 0, arena_bytes = 0;
  uint32_t max_cps = 0;
  SipKey key;

  size_t arena_offset() const { return kHeaderBytes + nslots * sizeof(Slot); }

  // Points the fields at `base`, from the header's (checked) values.
  void attach(uint8_t* b, size_t n) {
    base = b;
    bytes = n;
    header = reinterpret_cast<Header*>(b);
    nslots = header->slots;
    arena_bytes = header->arena;
    max_cps = header->max_cps;
    key = {header->k0, header->k1};
    slots = reinterpret_cast<Slot*>(b + kHeaderBytes);
    arena = b + arena_offset();
  }
};

namespace {

size_t layout_bytes(uint64_t slots, uint64_t arena) {
  return kHeaderBytes + size_t(slots) * sizeof(Slot) + size_t(arena);
}

void fill_header(Header* h, uint64_t slots, uint64_t arena, uint32_t max_cps) {
  std::memset(h, 0, sizeof *h);
  h->version = kVersion;
  h->max_cps = max_cps;
  h->slots = slots;
  h->arena = arena;
  const SipKey k = fresh_key();
  h->k0 = k.k0;
  h->k1 = k.k1;
  std::memcpy(h->magic, kMagic, sizeof kMagic);
}

bool sane(const Header& h, size_t file_bytes) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion &&
         h.slots >= 16 && (h.slots & (h.slots - 1)) == 0 && h.slots <= (uint64_t(1) << 32) &&
         h.arena >= 4096 && h.arena % 8 == 0 && h.arena <= (uint64_t(1) << 40) &&
         h.max_cps >= 1 && h.max_cps <= 4096 && file_bytes == layout_bytes(h.slots, h.arena);
}

// Past these, an opener starts a new file: adds would soon fail.
bool nearly_full(const Header& h) {
  return h.used > h.arena / 10 * 9 || h.files > h.slots / 3 * 2;
}

Index::Map* anonymous(uint64_t slots, uint64_t arena, uint32_t max_cps) {
  const size_t n = layout_bytes(slots, arena);
  void* b = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (b == MAP_FAILED) return nullptr;
  fill_header(static_cast<Header*>(b), slots, arena, max_cps);
  auto* m = new Index::Map;
  m->attach(static_cast<uint8_t*>(b), n);
  return m;
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// A new index file at `path` (replacing one there when `replace`, else failing if one
// appeared): made under a temporary name, so no one maps it before its header is whole.
std::string create_file(const std::string& path, uint64_t slots, uint64_t arena, uint32_t max_cps,
                        bool replace) {
#if defined(__linux__)
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno_text("cannot create the index file");
  std::string why;
  Header h;
  fill_header(&h, slots, arena, max_cps);
  const size_t table = kHeaderBytes + size_t(slots) * sizeof(Slot);
  if (ftruncate(fd, off_t(layout_bytes(slots, arena))) != 0) {
    why = errno_text("cannot size the index file");
  } else if (fallocate(fd, 0, 0, off_t(table)) != 0) {
    why = errno_text("cannot allocate the index's slots (fallocate)");
  } else if (pwrite(fd, &h, sizeof h, 0) != ssize_t(sizeof h)) {
    why = errno_text("cannot write the index header");
  } else if (replace ? rename(tmp.c_str(), path.c_str()) != 0
                     : link(tmp.c_str(), path.c_str()) != 0) {
    why = errno == EEXIST ? "exists" : errno_text("cannot name the index file");
  }
  close(fd);
  unlink(tmp.c_str());  // after rename: a no-op (ENOENT); after link: the temporary name
  return why;
#else
  (void)path, (void)slots, (void)arena, (void)max_cps, (void)replace;
  return "index files need Linux's fallocate";
#endif
}

// Maps the index file at `path` if it is this user's alone, whole, of this format and not
// nearly full; *stale is set when a new one should replace it.
Index::Map* map_file(const std::string& path, std::string* why, bool* stale) {
  *stale = false;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *why = errno == ENOENT ? "missing" : errno_text("cannot open the index file");
    return nullptr;
  }
  struct stat st;
  Header h;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    // Another user's, or writable by others: its key or records could be someone else's.
    *why = "the index file is not a regular file of this user's alone (mode 0600)";
  } else if (pread(fd, &h, sizeof h, 0) != ssize_t(sizeof h) || !sane(h, size_t(st.st_size))) {
    *why = "the index file is of another format or size";
    *stale = true;
  } else if (nearly_full(h)) {
    *why = "the index file is nearly full";
    *stale = true;
  } else {
    void* b = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b != MAP_FAILED) {
      auto* m = new Index::Map;
      m->attach(static_cast<uint8_t*>(b), size_t(st.st_size));
      m->fd = fd;
      m->path = path;
      return m;
    }
    *why = errno_text("cannot map the index file");
  }
  close(fd);
  return nullptr;
}

std::mutex g_open;                      // open_index's; fork waits for it (pthread_atfork)
std::atomic<Index::Map*> g_map{nullptr};  // never unmapped: decodes may hold it
constexpr uint64_t kAnonSlots = uint64_t(1) << 21, kAnonArena = uint64_t(960) << 20;
constexpr uint32_t kAnonCheckpoints = 64;

void install(Index::Map* m) { g_map.store(m, std::memory_order_release); }

void atfork_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { g_open.lock(); }, [] { g_open.unlock(); }, [] { g_open.unlock(); });
  });
}

}  // namespace

std::string open_index(const std::string& path, uint64_t slots, uint64_t arena,
                       uint32_t max_checkpoints) {
  atfork_once();
  std::lock_guard<std::mutex> lock(g_open);
  Index::Map* now = g_map.load(std::memory_order_acquire);
  if (now != nullptr && now->path == path && (!path.empty() || now->fd < 0)) return {};
  Header want;
  fill_header(&want, slots, arena, max_checkpoints);
  if (!sane(want, layout_bytes(slots, arena))) return "bad index parameters";
  std::string why;
  if (!path.empty()) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      bool stale = false;
      if (Index::Map* m = map_file(path, &why, &stale)) {
        install(m);
        return {};
      }
      if (why != "missing" && !stale) break;
      const std::string made = create_file(path, slots, arena, max_checkpoints, stale);
      if (!made.empty() && made != "exists") {
        why = made;
        break;
      }
    }
  }
  Index::Map* m = anonymous(slots, arena, max_checkpoints);
  if (m == nullptr) return why.empty() ? errno_text("cannot map an anonymous index") : why;
  install(m);
  return why;
}

Index current_index() {
  Index::Map* m = g_map.load(std::memory_order_acquire);
  if (m == nullptr) {
    atfork_once();
    std::lock_guard<std::mutex> lock(g_open);
    m = g_map.load(std::memory_order_acquire);
    if (m == nullptr) {
      m = anonymous(kAnonSlots, kAnonArena, kAnonCheckpoints);
      if (m == nullptr) std::abort();  // no address space for a sparse mapping: nothing to do
      install(m);
    }
  }
  return Index(m);
}

IndexKey Index::key_of(const uint8_t* d, size_t n) const { return siphash(map_->key, d, n); }

uint64_t keyed_hash(uint64_t k0, uint64_t k1, const uint8_t* d, size_t n) { return siphash({k0, k1}, d, n).h0; }

uint32_t Index::max_checkpoints() const { return map_->max_cps; }

bool Index::full() const {
  const Map& m = *map_;
  return load(&m.header->used) >= m.arena_bytes || load(&m.header->files) >= m.nslots / 4 * 3;
}

namespace {

uint64_t mac_of(const SipKey& key, Record r, const uint64_t* cps) {
  r.mac = 0;
  uint8_t buf[sizeof(Record) + 8 * 4096];
  std::memcpy(buf, &r, sizeof r);
  std::memcpy(buf + sizeof r, cps, 8 * size_t(r.ncps));
  return siphash(key, buf, sizeof r + 8 * size_t(r.ncps)).h0;
}

}  // namespace

bool Index::find(const IndexKey& key, uint32_t mcus, uint32_t nbytes,
                 std::vector<uint64_t>* out) const {
  const Map& m = *map_;
  const uint64_t tag = key.h0 | 1, mask = m.nslots - 1;
  for (int k = 0; k < kProbes; ++k) {
    const Slot& s = m.slots[(key.h0 + uint64_t(k)) & mask];
    const uint64_t t = load(&s.tag);
    if (t == 0) return false;
    if (t != tag) continue;
    const uint64_t ref = load(&s.ref);
    if (ref == 0) continue;
    const uint64_t off = ref - 1;
    if (off % 8 != 0 || off > m.arena_bytes - sizeof(Record)) return false;
    Record r;
    std::memcpy(&r, m.arena + off, sizeof r);
    if (r.h0 != key.h0 || r.h1 != key.h1 || r.size != key.size) continue;
    if (r.mcus != mcus || r.nbytes != nbytes || r.ncps == 0 || r.ncps > m.max_cps ||
        off + sizeof r + 8 * uint64_t(r.ncps) > m.arena_bytes) {
      return false;
    }
    out->resize(r.ncps);
    std::memcpy(out->data(), m.arena + off + sizeof r, 8 * size_t(r.ncps));
    return mac_of(m.key, r, out->data()) == r.mac;
  }
  return false;
}

void Index::add(const IndexKey& key, uint32_t mcus, uint32_t nbytes, const uint64_t* cps,
                uint32_t n) {
  Map& m = *map_;
  if (n == 0 || n > m.max_cps) return;
  const uint64_t tag = key.h0 | 1, mask = m.nslots - 1;
  // The first empty slot on the key's probe sequence, unless the key is there already.
  Slot* slot = nullptr;
  for (int k = 0; k < kProbes && slot == nullptr; ++k) {
    Slot& s = m.slots[(key.h0 + uint64_t(k)) & mask];
    const uint64_t t = load(&s.tag);
    if (t == tag) return;
    if (t == 0) slot = &s;
  }
  if (slot == nullptr) return;
  const uint64_t bytes = sizeof(Record) + 8 * uint64_t(n);
  const uint64_t off = __atomic_fetch_add(&m.header->used, bytes, __ATOMIC_RELAXED);
  if (off + bytes > m.arena_bytes) return;  // full: `used` stays past the end
#if defined(__linux__)
  // Disk blocks first: a write to a sparse page with no space left would fault the process.
  if (m.fd >= 0 && fallocate(m.fd, 0, off_t(m.arena_offset() + off), off_t(bytes)) != 0) return;
#endif
  Record r{key.h0, key.h1, key.size, mcus, nbytes, n, 0, 0};
  r.mac = mac_of(m.key, r, cps);
  std::memcpy(m.arena + off, &r, sizeof r);
  std::memcpy(m.arena + off + sizeof r, cps, 8 * size_t(n));
  // Claim a slot (another process may have taken this one, or added the key, meanwhile), then
  // publish: the record's bytes are written before the release store of its offset.
  for (int k = 0; k < kProbes; ++k) {
    Slot& s = m.slots[(key.h0 + uint64_t(k)) & mask];
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(&s.tag, &expected, tag, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&s.ref, off + 1, __ATOMIC_RELEASE);
      __atomic_fetch_add(&m.header->files, 1, __ATOMIC_RELAXED);
      return;
    }
    if (expected == tag) return;  // added by another decode meanwhile
  }
}

IndexStats Index::stats() const {
  const Map& m = *map_;
  IndexStats s;
  s.path = m.path;
  s.files = load(&m.header->files);
  s.used = std::min(load(&m.header->used), m.arena_bytes);
  s.arena = m.arena_bytes;
  s.slots = m.nslots;
  s.max_checkpoints = m.max_cps;
  return s;
}

}  // namespace fastdata
