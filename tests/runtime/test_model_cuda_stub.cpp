// CudaModel where it cannot run: a build without CUDA (the CI machine) must refuse with a clear
// CudaError, not link-fail or crash; a CUDA build without a visible device likewise. The GPU
// results themselves are in tests/cuda/test_runtime_cuda.cpp (label cuda).
#include <string>

#include <gtest/gtest.h>

#include "runtime_test_util.h"
#include "veloxquant/error.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/model_cuda.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

TEST(RuntimeCudaModel, RefusesClearlyWithoutCuda) {
#if defined(VQ_HAVE_CUDA) && VQ_HAVE_CUDA
  GTEST_SKIP() << "built with CUDA: tests/cuda/test_runtime_cuda.cpp covers CudaModel";
#else
  ModelOptions o;
  o.n_threads = 1;
  const auto model = Model::load(vqtest::tiny_dir("tiny-qwen2"), o);
  try {
    CudaModel::create(*model);
    FAIL() << "CudaModel::create succeeded in a build without CUDA";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
#endif
}
