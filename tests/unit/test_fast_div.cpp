// FastDiv (src/cuda/kernels.h): the multiply-high division the CUDA attention kernel uses for
// its per-launch divisors (GQA group, row chunks, splits, window weight), and the 32-bit split
// arithmetic built on it, which must give the host's attn_split_chunk exactly (the host's L2
// hint assumes the kernel's split). Tolerance tier: exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/kernels.h"

using veloxquant::cuda::attn_split_chunk;
using veloxquant::cuda::fast_div;
using veloxquant::cuda::FastDiv;
using veloxquant::cuda::make_fast_div;

namespace {

std::vector<uint32_t> edge_values(uint32_t d) {
  std::vector<uint32_t> xs = {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  // the last multiples of d below 2^31 and 2^32, and their neighbours
  for (uint64_t top : {uint64_t(1) << 31, uint64_t(1) << 32}) {
    const uint64_t k = (top - 1) / d * d;
    for (int64_t o = -1; o <= 1; ++o)
      if (int64_t(k) + o >= 0 && uint64_t(int64_t(k) + o) < (uint64_t(1) << 32)) xs.push_back(uint32_t(int64_t(k) + o));
  }
  return xs;
}

}  // namespace

TEST(FastDiv, EqualsIntegerDivisionForEveryDivisorKind) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (uint32_t s = 11; s < 32; ++s) {  // powers of two and their neighbours, up to 2^31 + 1
    divisors.push_back((1u << s) - 1), divisors.push_back(1u << s), divisors.push_back((1u << s) + 1);
  }
  for (int i = 0; i < 200; ++i) divisors.push_back(uint32_t(rng() % 0xFFFFFFFFull) + 1);
  divisors.push_back(0xFFFFFFFFu);
  for (uint32_t d : divisors) {
    const FastDiv f = make_fast_div(d);
    ASSERT_EQ(f.d, d);
    for (uint32_t x : edge_values(d)) ASSERT_EQ(fast_div(x, f), x / d) << "x = " << x << ", d = " << d;
    for (int i = 0; i < 300; ++i) {
      const uint32_t x = uint32_t(rng());
      ASSERT_EQ(fast_div(x, f), x / d) << "x = " << x << ", d = " << d;
    }
  }
  // every x for the divisors the kernel sees most (GQA groups, splits, the window weight)
  for (uint32_t d : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 10u, 12u, 16u, 32u}) {
    const FastDiv f = make_fast_div(d);
    for (uint64_t x = 0; x < (uint64_t(1) << 20); ++x) ASSERT_EQ(fast_div(uint32_t(x), f), uint32_t(x) / d);
  }
}

TEST(FastDiv, ZeroDivisorIsTreatedAsOne) {
  const FastDiv f = make_fast_div(0);
  EXPECT_EQ(f.d, 1u);
  EXPECT_EQ(fast_div(12345u, f), 12345u);
}

// The kernel's split of a segment: chunk = round_up(ceil(units / S), 32) in 32 bits through the
// FastDiv of S, the window rows' bounds through the FastDiv of the window weight. The host's
// attn_split_chunk (64-bit) must agree wherever attn_launch admits the launch (units < 2^31).
TEST(FastDiv, SplitChunkMatchesTheHostsSixtyFourBitArithmetic) {
  std::mt19937_64 rng(11);
  for (int it = 0; it < 200000; ++it) {
    const int S = int(rng() % 32) + 1;
    const uint32_t units =
        it % 4 == 0 ? uint32_t(rng() % 4096) : uint32_t(rng() % ((uint64_t(1) << 31) - 64));  // small and large
    const FastDiv fs = make_fast_div(uint32_t(S));
    const uint32_t chunk32 = (fast_div(units + uint32_t(S - 1), fs) + 31u) & ~31u;
    ASSERT_EQ(int64_t(chunk32), attn_split_chunk(units, S)) << "units " << units << ", splits " << S;
    const uint32_t ww = uint32_t(rng() % 40) + 1;
    const FastDiv fw = make_fast_div(ww);
    const uint32_t a = uint32_t(rng() % (uint64_t(1) << 30));
    ASSERT_EQ(fast_div(a + ww - 1, fw), uint32_t((int64_t(a) + ww - 1) / ww));
  }
}
