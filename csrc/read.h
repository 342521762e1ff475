// Reading a batch's image files whole on several threads: the size, the open and the read of
// each run with the GIL released, where Python's open().read() holds it for each file while
// the other cores wait for the batch. Raw POSIX calls only: no Python, no torch.
#pragma once
#include <cstdint>
#include <vector>

namespace fastdata {

struct OpenFile {
  int fd = -1;
  int64_t size = 0;   // bytes, from stat
  int error = 0;      // errno of the stat or open, else 0
  bool regular = false;  // a regular file (only these are read here; see open_files)
};

// Sizes each path (stat) and opens it, on up to `threads` threads. A directory is EISDIR, as
// Python's open() has it. A path that is neither a regular file nor a directory (a FIFO, a
// device) is not opened, and has regular false: its size says nothing of its contents, and the
// caller reads it another way.
void open_files(const std::vector<const char*>& paths, std::vector<OpenFile>* files, int threads);

// Reads files[i] (open and regular, error 0) into bufs[i], which holds files[i].size bytes,
// and closes every open descriptor, on up to `threads` threads. got[i] is the bytes read: less
// than the size when the file shrank since stat; -1 with files[i].error set when a read
// failed.
void read_files(std::vector<OpenFile>* files, const std::vector<uint8_t*>& bufs,
                std::vector<int64_t>* got, int threads);

}  // namespace fastdata
