// The checkpoint index: where to resume Huffman decoding inside each JPEG a machine has decoded,
// in one memory-mapped file that every process decoding on the machine shares (the training
// process, its workers, other jobs), across epochs and runs. entropy.cpp writes a file's
// checkpoints after its first whole decode and reads them in every later decode of the same
// bytes, to Huffman-decode only from the checkpoint before its window.
//
// The file (format version 1; all integers little-endian, as the host's):
//   header   4096 bytes: magic "FDJPIDX1", version, the largest checkpoint count a file may
//            have, the slot count (a power of two), the arena's size, the 128-bit SipHash key,
//            and two counters (arena bytes handed out, files published)
//   slots    16 bytes each: a file's tag (the first 64 bits of its key, low bit set; 0: empty)
//            and 1 + its record's offset in the arena (0: not yet published)
//   arena    records, 8-byte aligned: the file's full key (two hash words and its size), its
//            MCU count, entropy-coded bytes and checkpoint count, a 64-bit MAC, then the
//            checkpoints, 8 bytes each (entropy.cpp's packing)
// Every change is an atomic operation or a write into arena bytes no one else was handed, then
// published by a release store, so processes add files at once without a lock, and a reader
// never sees half a record as published. Records are never changed or removed: a full index
// takes no more files (the Python side starts a new one when it opens a nearly full file).
//
// Trust: a file finds its checkpoints by a keyed hash of all its bytes (SipHash-1-3-128, the
// key drawn from the OS when the index file is made and kept in it, readable by its owner
// only); a record is used only if its full key, MCU count and data length match the bytes at
// hand and its MAC (the same keyed hash over the record) checks, so neither a crafted file nor
// a torn or tampered record can give a decode another file's checkpoints. The slots and records
// are sparse on disk and fallocated before they are written (a full disk refuses a record; it
// never faults a decode).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastdata {

// A file's key: 128 bits of keyed hash over its bytes, and their count.
struct IndexKey {
  uint64_t h0 = 0, h1 = 0, size = 0;
};

// The first 64 bits of the keyed hash (SipHash-1-3-128) of d[0 .. n) under the key (k0, k1):
// what a record of files checked keeps of each file's bytes (`stamps` in module.cpp).
uint64_t keyed_hash(uint64_t k0, uint64_t k1, const uint8_t* d, size_t n);

struct IndexStats {
  std::string path;  // "" for an anonymous index (this process and the workers it forks)
  uint64_t files = 0, used = 0, arena = 0, slots = 0;
  uint32_t max_checkpoints = 0;
};

// Opens (or makes) the index file at `path` and makes it this process's index, or, with an
// empty path or when the file cannot be made, used or trusted (another user's, an older
// format, a filesystem without fallocate), an anonymous shared mapping of the same layout that
// this process's forked children share. Returns "" or why the file was not used. A nearly full
// or unusable file at `path` is replaced by a new one (processes that have the old one mapped
// keep it). Opening the index already open is a no-op.
std::string open_index(const std::string& path, uint64_t slots, uint64_t arena,
                       uint32_t max_checkpoints);

class Index;
// This process's index: the one opened, else an anonymous one made on first use. A handle: an
// index stays mapped for the process's life, also after another is opened.
Index current_index();

class Index {
 public:
  // The key of `n` bytes at `d` under this index's secret.
  IndexKey key_of(const uint8_t* d, size_t n) const;
  // The checkpoints kept for `key` (copied to `out`), if a record with this key, MCU count and
  // data length is published and its MAC checks.
  bool find(const IndexKey& key, uint32_t mcus, uint32_t nbytes, std::vector<uint64_t>* out) const;
  // Publishes a file's checkpoints unless it has a record, or the index is full.
  void add(const IndexKey& key, uint32_t mcus, uint32_t nbytes, const uint64_t* cps, uint32_t n);
  // Whether add would surely fail for want of room.
  bool full() const;
  uint32_t max_checkpoints() const;
  IndexStats stats() const;

  struct Map;  // the mapping (index.cpp)
  Index() = default;  // none: only for assigning one later
  explicit Index(Map* map) : map_(map) {}

 private:
  Map* map_ = nullptr;
};

}  // namespace fastdata
