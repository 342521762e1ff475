// The tar walk's common case in C++: consecutive plain regular-file headers, as
// fastdata/sources/tarformat.py's walk_tar takes them (_plain_header: type "0", every numeric
// field plain octal, the unsigned checksum right). The walk stops at the first header that is
// anything else, and walk_tar goes on from there in Python: pax and GNU long-name headers,
// zero blocks, damage and its messages stay in one place. A shard's two headers an image,
// parsed in Python, cost about half of a block read (benchmarks/results/MEASURED.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bytes.h"

namespace fastdata {

struct TarMember {
  int64_t offset;  // where its header starts
  int64_t data;    // where its data starts
  int64_t size;    // its data's bytes
  // its name's bytes within the header: the USTAR prefix (prefix_len 0: none) and the name
  // field, each up to its first NUL; the name is prefix + "/" + name when there is a prefix
  size_t prefix_len, name_len;
  const uint8_t* header;
};

// Walks bytes [pos, stop) of a tar whose bytes from `start` on are buf: appends each plain
// regular member whose header and data lie wholly in buf, and returns the position of the
// first header not taken (>= stop where every one was).
int64_t walk_plain_tar(const ByteSpan& buf, int64_t start, int64_t pos, int64_t stop,
                       std::vector<TarMember>* out);

}  // namespace fastdata
