#include "read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "parallel.h"

namespace fastdata {

void open_files(const std::vector<const char*>& paths, std::vector<OpenFile>* files, int threads) {
  files->assign(paths.size(), OpenFile{});
  parallel_for(int64_t(paths.size()), threads, [&](int64_t i) {
    OpenFile& f = (*files)[size_t(i)];
    // stat before open: opening a FIFO would connect to (or wait for) its writer.
    struct stat st;
    if (::stat(paths[size_t(i)], &st) != 0) {
      f.error = errno;
      return;
    }
    if (S_ISDIR(st.st_mode)) {
      f.error = EISDIR;
      return;
    }
    if (!S_ISREG(st.st_mode)) return;
    int fd;
    do {
      fd = ::open(paths[size_t(i)], O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      f.error = errno;
      return;
    }
    f.fd = fd;
    f.size = int64_t(st.st_size);  // a file that shrinks before its read is read to its end
    f.regular = true;
  });
}

void read_files(std::vector<OpenFile>* files, const std::vector<uint8_t*>& bufs,
                std::vector<int64_t>* got, int threads) {
  got->assign(files->size(), 0);
  parallel_for(int64_t(files->size()), threads, [&](int64_t i) {
    OpenFile& f = (*files)[size_t(i)];
    if (f.fd < 0) return;
    int64_t done = 0;
    while (done < f.size) {
      const ssize_t r = ::pread(f.fd, bufs[size_t(i)] + done, size_t(f.size - done), off_t(done));
      if (r < 0) {
        if (errno == EINTR) continue;
        f.error = errno;
        done = -1;
        break;
      }
      if (r == 0) break;  // the file shrank since stat
      done += r;
    }
    (*got)[size_t(i)] = done;
    ::close(f.fd);
    f.fd = -1;
  });
}

}  // namespace fastdata
