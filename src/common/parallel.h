// A minimal fork-join loop for the host paths (reference and cpu): std::thread workers pull
// work item indices from an atomic counter. Which thread runs an item never changes its
// result (each item writes its own outputs), so results do not depend on the thread count.
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

#include "flashattn/flashattn.h"

namespace flashattn {

// Worker threads for host paths: FLASHATTN_NUM_THREADS if set (>= 1), else the hardware's.
inline int host_num_threads() {
  if (const char* env = std::getenv("FLASHATTN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// Runs body(item, scratch) for item in [0, n_items) on up to host_num_threads() threads, where
// scratch = make_scratch() is constructed once per thread (tile buffers, accumulators).
// Returns an error message (empty on success) if a body threw (e.g. allocation failure); if
// fewer threads than asked could start, the ones running finish the work.
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
