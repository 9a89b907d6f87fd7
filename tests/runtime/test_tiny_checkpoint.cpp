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

// Tensors of 2^20 values or more are drawn on several threads, each from its chunk's place in
// the one random stream (the benchmark presets' ~0.4 G values): the files are those of one
// thread, byte for byte, whatever the thread count (3 leaves chunks that do not divide evenly).
TEST(RuntimeTinyCheckpoint, LargeTensorsDoNotDependOnTheThreadCount) {
  vqtest::TinySpec spec = vqtest::tiny_specs().at(1);  // qwen2: biases too
  spec.name = "threads";
  spec.hidden = 512;
  spec.n_heads = 8;
  spec.n_kv_heads = 2;
  spec.intermediate = 2056;  // gate/up/down: 1,052,672 values each, over the 2^20 bound
  spec.n_layers = 1;
  spec.dtype = "bfloat16";
  std::string files[2];
  for (int i = 0; i < 2; ++i) {
    const unsigned prev = vqtest::set_tiny_writer_threads(i == 0 ? 1 : 3);
    const fs::path tmp = fs::temp_directory_path() / ("vq_tiny_threads_" + std::to_string(::getpid()) + "_" + std::to_string(i));
    fs::remove_all(tmp);
    vqtest::write_tiny_checkpoint(spec, tmp);
    vqtest::set_tiny_writer_threads(prev);
    files[i] = slurp(tmp / "model.safetensors");
    fs::remove_all(tmp);
  }
  ASSERT_GT(files[0].size(), size_t(3) * 1052672 * 2) << "the checkpoint holds the three large matrices";
  EXPECT_TRUE(files[0] == files[1]) << "3 threads wrote other bytes than 1";
}
