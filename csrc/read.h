// Reading a batch's image files whole on several threads: the open, the size and the read of
// each run with the GIL released, where Python's open().read() holds it for each file while
// the other cores wait for the batch. Raw POSIX calls only: no Python, no torch.
#pragma once
#include <cstdint>
#include <vector>

namespace fastdata {

// The most bytes an image file may have (256 MiB): a JPEG, PNG or WebP within the pixel limit
// (kMaxImagePixels, 2**28 / 3) needs less unless it is padded, and a file is read whole into
// memory before its first bytes are looked at, so a larger one (a sparse file is cheap to make)
// is refused from its size. fastdata.image.read.MAX_FILE_BYTES is the same.
constexpr int64_t kMaxFileBytes = int64_t(1) << 28;

struct OpenFile {
  int fd = -1;
  int64_t size = 0;               // bytes, from fstat of the open descriptor
  int error = 0;                  // errno of the open or read, else 0
  const char* refused = nullptr;  // not a regular file: why ("not a regular file (a FIFO)", ...)
  bool too_large = false;         // over kMaxFileBytes (size says by how much): closed unread
};

// Why a file of this st_mode is not read: "not a regular file (a FIFO)", "(a character
// device)", "(a block device)", "(a socket)", or "not a regular file" for any other kind.
const char* not_regular(unsigned mode);

// Opens each path (O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC) and sizes it with fstat of
// the descriptor, on up to `threads` threads: what is sized is what is read, with no race
// between a stat and an open. A directory is EISDIR, as Python's open() has it. Any other file
// that is not regular (a FIFO, a device, a socket; a symlink to one is the same) is closed
// unread and has `refused` set: a FIFO could block its read forever, a device (/dev/zero) give
// bytes without end. A path that cannot be opened has `error`, or `refused` when it names a
// file that is not regular (a socket cannot be opened at all: ENXIO). A file over
// kMaxFileBytes is closed unread with `too_large` set.
void open_files(const std::vector<const char*>& paths, std::vector<OpenFile>* files, int threads);

// Reads files[i] (open: fd >= 0) into bufs[i], which holds files[i].size bytes, and closes
// every open descriptor, on up to `threads` threads. got[i] is the bytes read: never more than
// the size, less when the file shrank since it was sized; -1 with files[i].error set when a
// read failed.
void read_files(std::vector<OpenFile>* files, const std::vector<uint8_t*>& bufs,
                std::vector<int64_t>* got, int threads);

}  // namespace fastdata
