// tests/cuda/test_cuda_encode_hard.cpp — the bulk encoders (sub_dim 4, 8- and 12-bit codes; the
// scans and the candidate grid's kernel, with 8- and 16-bit candidate lists) and the latency-mode
// one, at head_dim 64/128/256 and 80/96, against the CPU encoder on inputs built to break it: exact centroids, exact
// midpoints of two centroids, near-midpoints, duplicated centroids (exact ties), tiny, huge
// and overflowing sub-vectors, zeros and non-finite entries. Codes must be bit-identical to
// ProductQuantizer::encode (it caught the GPU's exact re-rank using FMA where the CPU does not).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "veloxquant/pq.h"

namespace {

using namespace veloxquant;
using namespace vq_cuda_test;

TEST(CudaEncode, BulkEncoderMatchesTheCpuEncoderOnHardInputs) {
  VQ_SKIP_WITHOUT_GPU();
  for (const uint64_t seed : {uint64_t(0x7C0DE), uint64_t(0x7C0DF)}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (int D : {64, 128, 256, 80, 96, 112, 160, 192})
    for (int bits : {8, 12}) {
      SCOPED_TRACE("head_dim " + std::to_string(D) + ", " + std::to_string(bits) + "-bit codes");
      const int H = 2, n = 301;  // 602 token-heads: the last warp job is partial
      const int nc = 1 << bits, tie = bits == 8 ? 200 : 3000;
      ProductQuantizer pq(D, {4, bits});
      pq.set_random_codebook(seed + D + uint64_t(bits), seed & 1 ? 0.05f : 3.0f);
      std::vector<float> cb = pq.codebook;
      for (int j = 0; j < 4; ++j) cb[tie * 4 + j] = cb[5 * 4 + j], cb[77 * 4 + j] = cb[5 * 4 + j];  // exact ties
      pq.set_codebook(cb);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_int_distribution<int> pick(0, nc - 1);
      const float scales[] = {1e-30f, 1e-8f, 1e-3f, 0.05f, 1.0f, 30.0f, 1e4f, 1e15f};
      std::vector<float> x(size_t(H) * n * D);
      int kinds[9] = {};
      for (size_t s = 0; s < x.size() / 4; ++s) {
        float* v = x.data() + 4 * s;
        const float* a = cb.data() + 4 * pick(rng);
        const float* b = cb.data() + 4 * pick(rng);
        const int kind = int(rng() % 9);
        ++kinds[kind];
        for (int j = 0; j < 4; ++j) {
          switch (kind) {
            case 0: v[j] = nd(rng) * scales[rng() % 8]; break;               // random, any scale
            case 1: v[j] = a[j]; break;                                     // on a centroid
            case 2: v[j] = 0.5f * (a[j] + b[j]); break;                     // midpoint: ties
            case 3: v[j] = 0.5f * (a[j] + b[j]) * (1.0f + 1e-7f * nd(rng)); break;  // near-midpoint
            case 4: v[j] = a[j] * (1.0f + 1e-6f * nd(rng)); break;          // next to a centroid
            case 5: v[j] = 0.0f; break;
            case 6: v[j] = nd(rng) * 1e19f; break;                          // squares overflow
            case 7: v[j] = j == 2 ? (rng() & 1 ? NAN : INFINITY) : nd(rng); break;  // non-finite
            default: v[j] = cb[5 * 4 + j] + 1e-3f * nd(rng); break;         // near the tied triple
          }
        }
      }
      const int64_t rows = int64_t(H) * n;
      std::vector<uint8_t> want(size_t(rows * pq.code_bytes));
      pq.encode(x.data(), rows, want.data(), 1);

      const int rs = int(pq.code_bytes + 3) / 4 * 4;
      Tensor xd = to_device(Tensor::from_floats(x, {1, H, n, D}, DType::F32));
      Tensor cbd = to_device(Tensor::from_floats(pq.codebook, {nc, 4}, DType::F32));
      Tensor nrmd = to_device(Tensor::from_floats(pq.centroid_norms, {nc}, DType::F32));
      Tensor codes = Tensor::empty({rows * rs}, DType::U8, Device::cuda(0));
      Tensor zeros = Tensor::empty({1}, DType::I32, Device::cuda(0));
      Tensor err = Tensor::empty({1}, DType::I32, Device::cuda(0));
      ASSERT_EQ(cudaMemset(zeros.data(), 0, 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(err.data(), 0, 4), cudaSuccess);
      float cmax = 0;
      for (float v : pq.centroid_norms) cmax = std::max(cmax, std::sqrt(v));
      cuda::EncodeParams e;
      e.batch = 1, e.n_kv_heads = H, e.head_dim = D, e.n_new = n;
      cuda::DevTensor4 dt;
      dt.data = xd.data(), dt.dtype = DType::F32;
      dt.stride[0] = int64_t(H) * n * D, dt.stride[1] = int64_t(n) * D, dt.stride[2] = D, dt.stride[3] = 1;
      e.k = e.v = dt;
      e.use_hadamard = 0;
      e.k_cb = e.v_cb = cbd.ptr<float>();
      e.k_norms = e.v_norms = nrmd.ptr<float>();
      e.k_bits = e.v_bits = bits;
      e.k_sub = e.v_sub = 4;
      e.k_cmax = e.v_cmax = cmax;
      e.k_codes = e.v_codes = codes.ptr<uint8_t>();
      e.code_cap = n;
      e.k_row_stride = e.v_row_stride = rs;
      e.seq_len = zeros.ptr<int32_t>();
      e.res_count = zeros.ptr<int32_t>();
      e.residual_length = 0;
      e.error_flag = err.ptr<int>();
      e.sides = 2;  // values: no transform, so the crafted sub-vectors reach the search as they are
      // the candidate grid (variant 3 below): inputs past its far box take the full oracle scan
      const cuda::DeviceEncodeGrid dg = cuda::upload_encode_grid(pq.codebook.data(), nc, 4, Device::cuda(0));
      ASSERT_NE(dg.view.cells, nullptr) << "a sub_dim-4 codebook of <= 4096 centroids must get a candidate grid";
      ASSERT_EQ(dg.view.wide, bits > 8 ? 1 : 0);
      // 12 bits: also the grid the caches build on the device (variant 4)
      const cuda::DeviceEncodeGrid dgd = cuda::build_encode_grid_on_device(pq.codebook.data(), nc, 4, Device::cuda(0));
      ASSERT_EQ(dgd.view.cells != nullptr, bits > 8);
      // every bulk kernel (EncodeParams::bulk_variant; 3, 4: 1 + grid), then (5) the latency-mode
      // kernel; head_dim 80 and 96 run the first kernel whatever the variant says
      for (const int variant : {0, 1, 2, 3, 4, 5}) {
        if (variant == 4 && !dgd.view.cells) continue;
        SCOPED_TRACE("bulk_variant " + std::to_string(variant));
        e.bulk_variant = variant >= 3 ? 1 : variant;
        e.v_grid = variant == 3 ? dg.view : variant == 4 ? dgd.view : cuda::EncodeGrid{};
        ASSERT_EQ(cudaMemset(codes.data(), 0xAB, size_t(rows * rs)), cudaSuccess);
        cuda::encode_launch(e, variant == 5, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> got(size_t(rows * rs));
        ASSERT_EQ(cudaMemcpy(got.data(), codes.data(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int m = 0; m < pq.n_sub; ++m) {
            const uint32_t g = read_code(got.data() + r * rs, m, bits), w = read_code(want.data() + r * pq.code_bytes, m, bits);
            if (g != w && ++bad <= 5)
              ADD_FAILURE() << "row " << r << " sub " << m << ": cuda " << g << ", cpu " << w << ", x = ("
                            << x[size_t(r * D + 4 * m)] << ", " << x[size_t(r * D + 4 * m + 1)] << ", "
                            << x[size_t(r * D + 4 * m + 2)] << ", " << x[size_t(r * D + 4 * m + 3)] << ")";
          }
        EXPECT_EQ(bad, 0) << "of " << rows * pq.n_sub << " codes differ from the CPU encoder";
      }
      for (int k = 0; k < 9; ++k) EXPECT_GT(kinds[k], 0) << "input kind " << k << " never drawn";
    }
  }
}

}  // namespace
