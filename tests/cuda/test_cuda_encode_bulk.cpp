// tests/cuda/test_cuda_encode_bulk.cpp — every bulk encode kernel (EncodeParams::bulk_variant
// 0, 1, 2, and 1 with the codebook's candidate grid, host- or device-built) against the CPU pipeline for keys (1/λ scaling + FWHT in the CPU's order, then the
// CPU encoder) and values (the CPU encoder alone): head_dim 64/128/256, sub_dim 4/8, 8/10/12-bit
// codebooks, F16/BF16/F32 sources, contiguous and strided rows, a partial last warp job, rows of
// very different norms. Codes must be bit-identical; the variants must agree with each other.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/pq_grid_cases.h"
#include "cuda_test_util.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"

namespace {

using namespace veloxquant;
using namespace vq_cuda_test;

struct BulkCase {
  int D, sub, bits;
  DType dt;
  int inner_stride;  ///< element stride of head_dim (1: contiguous rows)
  int row_pad;       ///< extra elements between tokens
};

TEST(CudaEncode, BulkKernelsMatchTheCpuTransformAndEncoder) {
  VQ_SKIP_WITHOUT_GPU();
  const std::vector<BulkCase> cases = {
      {128, 4, 8, DType::F16, 1, 0},  {128, 4, 8, DType::F32, 1, 8},   {64, 4, 8, DType::BF16, 1, 0},
      {256, 4, 8, DType::F16, 1, 4},  {128, 8, 8, DType::F16, 1, 0},   {64, 8, 10, DType::F16, 2, 0},
      {256, 8, 8, DType::F32, 1, 0},  {128, 4, 12, DType::F16, 1, 0},  {128, 4, 10, DType::F16, 3, 2},
  };
  const uint64_t seed = 0xB11C;
  std::mt19937_64 rng(seed);
  for (const BulkCase& c : cases) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", head_dim " + std::to_string(c.D) + ", d" + std::to_string(c.sub) +
                 "b" + std::to_string(c.bits) + ", dtype " + std::to_string(int(c.dt)) + ", inner stride " +
                 std::to_string(c.inner_stride));
    const int B = 2, H = 3, n = 37, D = c.D;  // 222 token-heads: jobs end mid-warp
    ProductQuantizer pq(D, {c.sub, c.bits});
    pq.set_random_codebook(seed + uint64_t(c.bits) * 7 + uint64_t(c.sub), 0.8f);
    // source rows: N(0, 1) with a few outlier channels and a per-token scale (norms vary a lot)
    const int64_t tok_stride = int64_t(D) * c.inner_stride + c.row_pad;
    const int64_t elems = int64_t(B) * H * n * tok_stride;
    std::vector<float> src(size_t(elems), 0.0f), x(size_t(B) * H * n * D);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-3.0f, 2.0f);
    for (int64_t r = 0; r < int64_t(B) * H * n; ++r) {
      const float ts = std::exp(ud(rng));
      for (int d = 0; d < D; ++d) {
        float v = nd(rng) * ts * (d % 17 == 3 ? 8.0f : 1.0f);
        // what the device reads after rounding to the source dtype
        v = c.dt == DType::F16 ? half_to_float(float_to_half(v)) : c.dt == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : v;
        src[size_t(r * tok_stride + int64_t(d) * c.inner_stride)] = v;
        x[size_t(r * D + d)] = v;
      }
    }
    std::vector<float> lambda(size_t(H) * D);
    std::uniform_real_distribution<float> ld(0.2f, 4.0f);
    for (auto& l : lambda) l = ld(rng);
    KeyTransform tf(H, D, lambda, true);
    std::vector<float> xk = x;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) tf.forward_keys(xk.data() + (int64_t(b) * H + h) * n * D, n, h);
    const int64_t rows = int64_t(B) * H * n;
    std::vector<uint8_t> want_k(size_t(rows * pq.code_bytes)), want_v(size_t(rows * pq.code_bytes));
    pq.encode(xk.data(), rows, want_k.data(), 1);
    pq.encode(x.data(), rows, want_v.data(), 1);

    const int rs = int(pq.code_bytes + 3) / 4 * 4;
    Tensor xd = to_device(Tensor::from_floats(src, {elems}, c.dt));
    Tensor cbd = to_device(Tensor::from_floats(pq.codebook, {int64_t(pq.codebook.size())}, DType::F32));
    Tensor nrmd = to_device(Tensor::from_floats(pq.centroid_norms, {int64_t(pq.centroid_norms.size())}, DType::F32));
    Tensor ild = to_device(Tensor::from_floats(tf.inv_lambda, {H, D}, DType::F32));
    Tensor kc = Tensor::empty({rows * rs}, DType::U8, Device::cuda(0));
    Tensor vc = Tensor::empty({rows * rs}, DType::U8, Device::cuda(0));
    Tensor lens = Tensor::empty({B}, DType::I32, Device::cuda(0));
    Tensor err = Tensor::empty({1}, DType::I32, Device::cuda(0));
    ASSERT_EQ(cudaMemset(lens.data(), 0, size_t(B) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(err.data(), 0, 4), cudaSuccess);
    float cmax = 0;
    for (float v : pq.centroid_norms) cmax = std::max(cmax, std::sqrt(v));
    cuda::EncodeParams e;
    e.batch = B, e.n_kv_heads = H, e.head_dim = D, e.n_new = n;
    cuda::DevTensor4 dt;
    dt.data = xd.data(), dt.dtype = c.dt;
    dt.stride[0] = int64_t(H) * n * tok_stride, dt.stride[1] = int64_t(n) * tok_stride, dt.stride[2] = tok_stride,
    dt.stride[3] = c.inner_stride;
    e.k = e.v = dt;
    e.inv_lambda = ild.ptr<float>();
    e.use_hadamard = 1;
    e.hadamard_scale = float(1.0 / std::sqrt(double(D)));
    e.k_cb = e.v_cb = cbd.ptr<float>();
    e.k_norms = e.v_norms = nrmd.ptr<float>();
    e.k_bits = e.v_bits = c.bits;
    e.k_sub = e.v_sub = c.sub;
    e.k_cmax = e.v_cmax = cmax;
    e.k_codes = kc.ptr<uint8_t>(), e.v_codes = vc.ptr<uint8_t>();
    e.code_cap = n;
    e.k_row_stride = e.v_row_stride = rs;
    e.seq_len = lens.ptr<int32_t>();
    e.res_count = lens.ptr<int32_t>();
    e.error_flag = err.ptr<int>();
    e.sides = 3;
    // variant 3: bulk_variant 1 with the codebook's candidate grid (sub_dim 4, <= 4096 centroids)
    const cuda::DeviceEncodeGrid dg = cuda::upload_encode_grid(pq.codebook.data(), pq.n_centroids, c.sub, Device::cuda(0));
    ASSERT_EQ(dg.view.cells != nullptr, c.sub == 4 && c.bits <= 12) << "which codebooks get a grid";
    ASSERT_EQ(dg.view.wide, dg.view.cells && c.bits > 8 ? 1 : 0) << "16-bit candidate lists for codebooks of > 256 centroids";
    // variant 4: the same with the grid built on the device (codebooks of > 256 centroids, as the
    // caches build theirs)
    const cuda::DeviceEncodeGrid dgd = cuda::build_encode_grid_on_device(pq.codebook.data(), pq.n_centroids, c.sub, Device::cuda(0));
    ASSERT_EQ(dgd.view.cells != nullptr, c.sub == 4 && c.bits > 8 && c.bits <= 12) << "which codebooks get a device-built grid";
    std::vector<int> variants = {0, 1, 2};
    if (dg.view.cells) variants.push_back(3);
    if (dgd.view.cells) variants.push_back(4);
    std::vector<std::vector<uint8_t>> got_all;
    for (const int variant : variants) {
      SCOPED_TRACE("bulk_variant " + std::to_string(variant));
      e.bulk_variant = variant >= 3 ? 1 : variant;
      e.k_grid = e.v_grid = variant == 3 ? dg.view : variant == 4 ? dgd.view : cuda::EncodeGrid{};
      ASSERT_EQ(cudaMemset(kc.data(), 0xCD, size_t(rows * rs)), cudaSuccess);
      ASSERT_EQ(cudaMemset(vc.data(), 0xCD, size_t(rows * rs)), cudaSuccess);
      cuda::encode_launch(e, false, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> gk(size_t(rows * rs)), gv(size_t(rows * rs));
      ASSERT_EQ(cudaMemcpy(gk.data(), kc.data(), gk.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gv.data(), vc.data(), gv.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (int side = 0; side < 2; ++side) {
        const std::vector<uint8_t>& got = side == 0 ? gk : gv;
        const std::vector<uint8_t>& want = side == 0 ? want_k : want_v;
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int m = 0; m < pq.n_sub; ++m) {
            const uint32_t g = read_code(got.data() + r * rs, m, c.bits), w = read_code(want.data() + r * pq.code_bytes, m, c.bits);
            if (g != w && ++bad <= 3)
              ADD_FAILURE() << (side == 0 ? "keys" : "values") << " row " << r << " sub " << m << ": cuda " << g
                            << ", cpu " << w;
          }
          for (int byte = int(pq.code_bytes); byte < rs; ++byte)  // row padding is written as zeros
            if (got[size_t(r * rs + byte)] != 0 && ++bad <= 3)
              ADD_FAILURE() << "row " << r << " padding byte " << byte << " = " << int(got[size_t(r * rs + byte)]);
        }
        EXPECT_EQ(bad, 0) << (side == 0 ? "keys" : "values") << ": of " << rows * pq.n_sub << " codes differ";
      }
      gk.insert(gk.end(), gv.begin(), gv.end());
      got_all.push_back(std::move(gk));
    }
    for (size_t v = 1; v < got_all.size(); ++v) EXPECT_TRUE(got_all[v] == got_all[0]) << "variant " << v << " differs from variant 0";

    // window rows: a ring of R exact rows (MemoryBound) and, with deq_outside, linear rows where
    // tokens born outside the window get their dequantized rows (Standard/Stash): the exact rows
    // must be the source rounded to fp16, and every variant must write the same bytes
    const int R = 16;
    for (const int layout : {0, 1}) {
      SCOPED_TRACE(layout == 0 ? "ring window" : "linear rows, dequantized outside the window");
      const int64_t wcap = layout == 0 ? R : n;
      Tensor kw = Tensor::empty({int64_t(B) * H * wcap * D}, DType::F16, Device::cuda(0));
      Tensor vw = Tensor::empty({int64_t(B) * H * wcap * D}, DType::F16, Device::cuda(0));
      cuda::EncodeParams w = e;
      w.k_win = kw.data(), w.v_win = vw.data();
      w.win_cap = wcap, w.win_ring = layout == 0, w.deq_outside = layout == 1;
      w.lambda = nullptr;  // identity: dequantized keys are FWHT(ĉ)·scale
      w.residual_length = R;
      std::vector<std::vector<uint16_t>> rows_all;
      for (const int variant : variants) {
        SCOPED_TRACE("bulk_variant " + std::to_string(variant));
        w.bulk_variant = variant == 3 ? 1 : variant;
        w.k_grid = w.v_grid = variant == 3 ? dg.view : cuda::EncodeGrid{};
        ASSERT_EQ(cudaMemset(kw.data(), 0x7B, size_t(kw.nbytes())), cudaSuccess);
        ASSERT_EQ(cudaMemset(vw.data(), 0x7B, size_t(vw.nbytes())), cudaSuccess);
        cuda::encode_launch(w, false, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> hk(size_t(kw.nbytes() / 2)), hv(size_t(vw.nbytes() / 2));
        ASSERT_EQ(cudaMemcpy(hk.data(), kw.data(), size_t(kw.nbytes()), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hv.data(), vw.data(), size_t(vw.nbytes()), cudaMemcpyDeviceToHost), cudaSuccess);
        int64_t bad = 0;
        for (int64_t bh = 0; bh < int64_t(B) * H; ++bh)
          for (int i = n - R; i < n; ++i) {  // window tokens: exact rows
            const int64_t slot = layout == 0 ? i % R : i;
            for (int d = 0; d < D; ++d) {
              const uint16_t want = float_to_half(x[size_t((bh * n + i) * D + d)]);
              bad += hk[size_t((bh * wcap + slot) * D + d)] != want;
              bad += hv[size_t((bh * wcap + slot) * D + d)] != want;
            }
          }
        EXPECT_EQ(bad, 0) << "window row elements differ from the source rounded to fp16";
        hk.insert(hk.end(), hv.begin(), hv.end());
        rows_all.push_back(std::move(hk));
      }
      for (size_t v = 1; v < rows_all.size(); ++v)
        EXPECT_TRUE(rows_all[v] == rows_all[0]) << "variant " << v << " wrote other rows than variant 0";
    }
    int flag = -1;
    ASSERT_EQ(cudaMemcpy(&flag, err.data(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(flag, 0);
  }
}

/// The grid built on the device (build_encode_grid_on_device, what the caches use for codebooks of
/// more than 256 centroids), downloaded: every answer through it equals the oracle's, on random,
/// clustered and all-on-the-hull codebooks and on points built to break it (centroids, midpoints
/// and their neighbours, cell boundaries, the far box's edges, far and non-finite points); its
/// lists are about as short as the host build's.
TEST(CudaEncode, DeviceBuiltGridsAnswerAsTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Book {
    std::string name;
    std::vector<float> cb;
  };
  std::vector<Book> books;
  for (int bits : {10, 12}) {
    ProductQuantizer pq(4, {4, bits});
    pq.set_random_codebook(17 + uint64_t(bits));
    books.push_back({"gaussian " + std::to_string(1 << bits), pq.codebook});
  }
  {  // 256 tight clusters of 16: many near-equal distances
    std::vector<float> cb;
    for (int k = 0; k < 256; ++k) {
      float m[4];
      for (float& v : m) v = 3.0f * nd(rng);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) cb.push_back(m[j] + 0.01f * nd(rng));
    }
    books.push_back({"clustered 4096", cb});
  }
  {  // every centroid on the hull: corner cells whose lists overflow (they scan)
    std::vector<float> cb;
    for (int i = 0; i < 4096; ++i) {
      float v[4], r = 0;
      for (float& x : v) x = nd(rng), r += x * x;
      for (float x : v) cb.push_back(x / std::sqrt(r));
    }
    books.push_back({"sphere 4096", cb});
  }
  for (const Book& b : books) {
    SCOPED_TRACE(b.name);
    const int n = int(b.cb.size() / 4);
    const cuda::DeviceEncodeGrid d = cuda::build_encode_grid_on_device(b.cb.data(), n, 4, Device::cuda(0));
    ASSERT_TRUE(d.host && d.view.cells && d.view.wide);
    const detail::CandidateGrid& grid = *d.host;
    ASSERT_EQ(grid.g, detail::default_grid_cells(n));
    ASSERT_EQ(grid.index_bits, 16);
    const detail::CandidateGrid host = detail::build_candidate_grid(b.cb.data(), n, 4, grid.g);
    for (int j = 0; j < 4; ++j) {  // the same geometry as the host build
      EXPECT_EQ(grid.lo[j], host.lo[j]);
      EXPECT_EQ(grid.inv_w[j], host.inv_w[j]);
      EXPECT_EQ(grid.far_lo[j], host.far_lo[j]);
      EXPECT_EQ(grid.far_hi[j], host.far_hi[j]);
    }
    const std::vector<std::array<float, 4>> pts = vq_grid_cases::points(b.cb, grid, uint32_t(n) + 17);
    int64_t bad = 0, listed = 0;
    for (const auto& x : pts) {
      const int want = vq_grid_cases::oracle(b.cb, x.data()), got = detail::grid_nearest(grid, b.cb.data(), n, x.data());
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << "x = (" << x[0] << ", " << x[1] << ", " << x[2] << ", " << x[3] << "): grid " << got << ", oracle "
                      << want;
      const int cell = detail::candidate_cell(grid, x.data());
      listed += cell >= 0 && (grid.cells[size_t(cell)] & 511u) != 0;
    }
    EXPECT_EQ(bad, 0) << "of " << pts.size() << " points";
    EXPECT_GT(listed, int64_t(pts.size()) / 2) << "most points must have a listed cell (the grid path, not the scan)";
    EXPECT_LE(grid.mean_candidates, 2.0 * host.mean_candidates + 1.0) << "device lists much longer than the host build's";
    std::printf("[cuda grid build] %-15s g=%d: device lists mean %.1f (max %d, %d scan cells), host build %.1f (max %d, "
                "%d scan cells); %zu points as the oracle\n",
                b.name.c_str(), grid.g, grid.mean_candidates, grid.max_candidates, grid.scan_cells, host.mean_candidates,
                host.max_candidates, host.scan_cells, pts.size());
  }
}

}  // namespace
