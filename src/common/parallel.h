// A minimal fork-join loop for the host paths (reference and cpu): std::thread workers pull
// work item indices from an atomic counter. Which thread runs an item never changes its
// result (each item writes its own outputs), so results do not depend on the thread count.
// Threads are started per call: at the sizes where threads pay off (>= ~1 ms of work) that
// costs < 0.1%, and nothing stays running between calls.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "flashattn/flashattn.h"

namespace flashattn {

// Worker threads asked for by the C ABI call running on this thread (options.num_threads), 0 =
// none. src/api sets it around the backend call (ScopedHostThreads); parallel_for forks from the
// calling thread, so a thread-local reaches it without a field in every params struct.
inline int& requested_host_threads() {
  static thread_local int n = 0;
  return n;
}

class ScopedHostThreads {
 public:
  explicit ScopedHostThreads(int n) : saved_(requested_host_threads()) { requested_host_threads() = n; }
  ~ScopedHostThreads() { requested_host_threads() = saved_; }
  ScopedHostThreads(const ScopedHostThreads&) = delete;
  ScopedHostThreads& operator=(const ScopedHostThreads&) = delete;

 private:
  int saved_;
};

// Worker threads for host paths: options.num_threads if > 0 (the explicit choice wins), else
// FLASHATTN_NUM_THREADS if set (>= 1), else the CPUs this process may run on (taskset, cpusets:
// hardware_concurrency() counts every CPU of the machine and would oversubscribe a pinned process).
inline int host_num_threads() {
  if (int n = requested_host_threads(); n > 0) return n;
  if (const char* env = std::getenv("FLASHATTN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// Runs body(item, scratch) for item in [0, n_items) on up to host_num_threads() threads (the
// calling thread is one of them), where scratch = make_scratch() is constructed once per thread
// (tile buffers, accumulators). Returns an error message (empty on success) if a body threw
// (e.g. allocation failure); if fewer threads than asked could start, the ones running finish
// the work.
template <typename MakeScratch, typename Body>
std::string parallel_for(int64_t n_items, MakeScratch&& make_scratch, Body&& body) {
  if (n_items <= 0) return {};
  int workers = host_num_threads();
  if (int64_t(workers) > n_items) workers = int(n_items);
  std::atomic<int64_t> next{0};
  std::mutex err_mu;
  std::string err;
  auto fail = [&](const char* what) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (err.empty()) err = what;
    next.store(n_items);
  };
  auto run = [&]() {
    try {
      auto scratch = make_scratch();
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n_items;) body(i, scratch);
    } catch (const std::bad_alloc&) {
      fail("host memory allocation failed");
    } catch (const std::exception& e) {
      fail(e.what());
    }
  };
  std::vector<std::thread> threads;
  try {
    threads.reserve(size_t(workers - 1));
    for (int w = 1; w < workers; ++w) threads.emplace_back(run);
  } catch (const std::exception&) {
    // Could not start more threads: the ones running (and this one) finish the work.
  }
  run();
  for (auto& t : threads) t.join();
  return err;
}

}  // namespace flashattn
