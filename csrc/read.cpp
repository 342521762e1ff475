#include "read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "parallel.h"

namespace fastdata {

const char* not_regular(unsigned mode) {
  if (S_ISFIFO(mode)) return "not a regular file (a FIFO)";
  if (S_ISCHR(mode)) return "not a regular file (a character device)";
  if (S_ISBLK(mode)) return "not a regular file (a block device)";
  if (S_ISSOCK(mode)) return "not a regular file (a socket)";
  return "not a regular file";
}

void open_files(const std::vector<const char*>& paths, std::vector<OpenFile>* files, int threads) {
  files->assign(paths.size(), OpenFile{});
  parallel_for(int64_t(paths.size()), threads, [&](int64_t i) {
    OpenFile& f = (*files)[size_t(i)];
    const char* path = paths[size_t(i)];
    // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer
    // (and a serial device's open does not wait for its line). It changes nothing for a
    // regular file, whose reads never block on it, so it is left set for the read.
    // O_NOCTTY: a terminal device opened here never becomes the process's terminal.
    int fd;
    do {
      fd = ::open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    struct stat st;
    if (fd < 0) {
      f.error = errno;
      // Name the kind where the path is one that is not read anyway (a socket's open is ENXIO).
      if (::stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        f.error = 0;
        f.refused = not_regular(unsigned(st.st_mode));
      }
      return;
    }
    if (::fstat(fd, &st) != 0) {
      f.error = errno;
      ::close(fd);
      return;
    }
    if (!S_ISREG(st.st_mode)) {
      if (S_ISDIR(st.st_mode)) {
        f.error = EISDIR;
      } else {
        f.refused = not_regular(unsigned(st.st_mode));
      }
      ::close(fd);
      return;
    }
    f.size = int64_t(st.st_size);  // the read stops there: a file that grows is read to this size
    if (f.size > kMaxFileBytes) {
      f.too_large = true;
      ::close(fd);
      return;
    }
    f.fd = fd;
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
      if (r == 0) break;  // the file shrank since it was sized: read to its end
      done += r;
    }
    (*got)[size_t(i)] = done;
    ::close(f.fd);
    f.fd = -1;
  });
}

}  // namespace fastdata
