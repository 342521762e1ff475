// The one thread pool pattern of csrc/: a call's items spread over a few threads started for it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace fastdata {

// The threads worth starting for `bytes` of memory-bound work (a copy, a table lookup, a hash):
// one per MiB, at most `threads`. Starting and joining a thread costs tens of microseconds, and
// more when the cores are busy (a training step, the loader's workers) and it waits for one;
// a MiB of copying takes about as long, so a smaller batch (CIFAR's 4 or 128 images) is done
// sooner on the calling thread alone.
inline int threads_for_bytes(int64_t bytes, int threads) {
  constexpr int64_t kBytesPerThread = int64_t(1) << 20;
  return int(std::max<int64_t>(1, std::min<int64_t>(threads, bytes / kBytesPerThread)));
}

// Runs fn(i) for every i in [0, n) on up to `threads` threads, the calling one included, each
// taking the next index when it is done with one: an item's cost varies tenfold (a decode with
// its crop and encoding, a read with the page cache). fn must not throw.
template <typename Fn>
void parallel_for(int64_t n, int threads, const Fn& fn) {
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  const int t = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  pool.reserve(size_t(t - 1));
  for (int k = 1; k < t; ++k) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads then; the ones running take the rest
    }
  }
  work();
  for (auto& th : pool) th.join();
}

}  // namespace fastdata
