// bench/common/llc_flush.h — evicts a CPU benchmark's data from the last-level cache.
//
// A model's decode step attends layer after layer, so each layer's cache comes from memory; a
// warm timing loop flatters whichever cache fits in L3. LlcFlush reads a buffer twice the L3's
// size (64 MiB where the OS does not say), one byte a cache line, with `threads` threads each
// reading its share, so that every core's private caches are cleared too. Call it between timed
// calls, outside the timed region. Used by bench/cpu/bench_decode.cpp (decode/paired_cold) and
// `veloxquant bench --cold` (tools/veloxquant/cmd_bench.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace veloxquant::bench {

class LlcFlush {
 public:
  explicit LlcFlush(int threads) : threads_(std::max(1, threads)) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    buf_.assign(std::max<size_t>(size_t(64) << 20, l3 > 0 ? 2 * size_t(l3) : 0), 1);
  }
  /// Bytes read by one call.
  size_t bytes() const { return buf_.size(); }
  void operator()() {
    std::vector<uint64_t> sums(size_t(threads_), 0);
    auto part = [&](int t) {
      const size_t a = buf_.size() * size_t(t) / size_t(threads_);
      const size_t b = buf_.size() * size_t(t + 1) / size_t(threads_);
      uint64_t acc = 0;
      for (size_t i = a; i < b; i += 64) acc += buf_[i];
      sums[size_t(t)] = acc;
    };
    std::vector<std::thread> th;
    for (int t = 1; t < threads_; ++t) th.emplace_back(part, t);
    part(0);
    for (auto& t : th) t.join();
    for (uint64_t x : sums) sink_ = sink_ + x;  // volatile: the reads cannot be dropped
  }

 private:
  int threads_;
  std::vector<uint8_t> buf_;
  volatile uint64_t sink_ = 0;
};

}  // namespace veloxquant::bench
