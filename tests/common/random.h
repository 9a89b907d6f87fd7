// tests/common/random.h — seeded Gaussian test data, shared by the unit tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace vqtest {

/// n floats drawn from N(0, scale²) by std::mt19937 seeded with `seed`.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

}  // namespace vqtest
