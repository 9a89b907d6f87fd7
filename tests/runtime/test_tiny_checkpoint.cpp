// The committed tiny checkpoints are exactly what tiny_checkpoint.cpp writes (so the
// reference logits computed from them by transformers stay tied to a reproducible input).
// VQ_WRITE_TINY_CHECKPOINTS=1 rewrites the committed copies instead of comparing.
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include <gtest/gtest.h>

#include "runtime_test_util.h"
#include "tiny_checkpoint.h"

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(RuntimeTinyCheckpoint, CommittedFilesMatchGenerator) {
  const fs::path data = vqtest::runtime_data();
  const char* write = std::getenv("VQ_WRITE_TINY_CHECKPOINTS");
  for (const auto& spec : vqtest::tiny_specs()) {
    if (write && std::string(write) == "1") {
      vqtest::write_tiny_checkpoint(spec, data / spec.name);
      continue;
    }
    const fs::path tmp = fs::temp_directory_path() / ("vq_tiny_" + std::to_string(::getpid()) + "_" + spec.name);
    fs::remove_all(tmp);
    vqtest::write_tiny_checkpoint(spec, tmp);
    int n_files = 0;
    for (const auto& e : fs::directory_iterator(tmp)) {
      const fs::path committed = data / spec.name / e.path().filename();
      ASSERT_TRUE(fs::exists(committed)) << committed << " is not committed";
      EXPECT_TRUE(slurp(e.path()) == slurp(committed))
          << committed << " differs from what tiny_checkpoint.cpp writes (rerun with VQ_WRITE_TINY_CHECKPOINTS=1 "
          << "and regenerate the reference logits)";
      ++n_files;
    }
    EXPECT_GE(n_files, 5) << spec.name;
    fs::remove_all(tmp);
  }
}
