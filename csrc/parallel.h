// The one thread pool pattern of csrc/: a call's items spread over a few threads started for it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace fastdata {

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
