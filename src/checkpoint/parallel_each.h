#pragma once

// Internal: runs a function on each of n items with a few threads, for the
// checkpoint's record reads and CRCs (src/checkpoint/member_reader.cpp,
// zip_writer.cpp).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace lamp::detail {

// Note [Checkpoint threads]
// `each(i)` runs once for every i in [0, n), on the calling thread and up
// to threads - 1 others that take the next index as they finish (give the
// largest items the smallest indices). The first exception stops the others
// at their next item and is rethrown here, after every thread has joined.
// Threads that cannot be started are done without. The threads are made
// per call: a checkpoint is read or written a few times a run, and its
// items take milliseconds.
inline void parallel_each(
    size_t n,
    int threads,
    const std::function<void(size_t)>& each) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (size_t i = next++; i < n && !failed; i = next++) {
      try {
        each(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!failed.exchange(true)) {
          error = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t workers =
      std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
  for (size_t t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (auto& t : pool) {
    t.join();
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

/// Threads for `bytes` of checkpoint data: one per 8 MiB, at most 16 and
/// the machine's cores.
inline int checkpoint_threads(uint64_t bytes) {
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(
      std::clamp<uint64_t>(bytes >> 23, 1, std::min<uint64_t>(16, cores)));
}

} // namespace lamp::detail
