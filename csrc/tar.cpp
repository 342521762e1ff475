#include "tar.h"

#include <cstring>

namespace fastdata {
namespace {

constexpr int64_t kBlock = 512;

// The numeric fields (offset, width) _plain_header checks: mode, uid, gid, size, mtime,
// checksum, devmajor, devminor.
constexpr int kNumeric[][2] = {{100, 8}, {108, 8}, {116, 8}, {124, 12},
                               {136, 12}, {148, 8}, {329, 8}, {337, 8}};

// Whether f[0, n) is spaces, then octal digits, then spaces and NULs (the regex
// "[ ]*[0-7]*[ \0]*" matched whole: taking each part greedily finds any match there is).
bool plain_octal(const uint8_t* f, int n) {
  int i = 0;
  while (i < n && f[i] == ' ') ++i;
  while (i < n && f[i] >= '0' && f[i] <= '7') ++i;
  while (i < n && (f[i] == ' ' || f[i] == 0)) ++i;
  return i == n;
}

// A plain_octal field's value: its digits (none: 0). At most 12 digits: 36 bits.
int64_t octal_value(const uint8_t* f, int n) {
  int i = 0;
  while (i < n && f[i] == ' ') ++i;
  int64_t v = 0;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) v = v * 8 + (f[i] - '0');
  return v;
}

size_t field_len(const uint8_t* f, size_t n) {
  const void* nul = std::memchr(f, 0, n);
  return nul ? size_t(static_cast<const uint8_t*>(nul) - f) : n;
}

}  // namespace

int64_t walk_plain_tar(const ByteSpan& buf, int64_t start, int64_t pos, int64_t stop,
                       std::vector<TarMember>* out) {
  const int64_t end = start + int64_t(buf.size);
  while (pos < stop && pos >= start && pos + kBlock <= end) {
    const uint8_t* h = buf.data + (pos - start);
    if (h[156] != '0') break;
    bool plain = true;
    for (const auto& f : kNumeric) plain = plain && plain_octal(h + f[0], f[1]);
    if (!plain) break;
    // the unsigned checksum: every byte summed, the checksum field's 8 taken as spaces
    int64_t sum = 256;
    for (int k = 0; k < kBlock; ++k) sum += h[k];
    for (int k = 148; k < 156; ++k) sum -= h[k];
    if (octal_value(h + 148, 8) != sum) break;
    const int64_t size = octal_value(h + 124, 12);
    const int64_t data = pos + kBlock;
    if (data + size > end) break;  // cut off: walk_tar says so
    out->push_back(TarMember{pos, data, size, field_len(h + 345, 155), field_len(h, 100), h});
    pos = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return pos;
}

}  // namespace fastdata
