// src/cpu/pq.cpp — the optimised product quantizer: construction/validation, encode (nearest
// centroid), decode, query lookup tables, and LSB-first bit packing of the codes.
//
// Layouts: x [n, head_dim] f32 row-major; codebook [n_centroids, sub_dim]; codes [n, code_bytes]
// with code m of a row in bits [m·codebook_bits, (m+1)·codebook_bits), LSB first.
//
// Encode is an exact nearest-centroid search (src/cpu/pq_nearest.cpp: SIMD ||c||² − 2·x·c
// scores with near-ties re-ranked by the oracle's distance), so its codes equal pq_encode_ref's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/pq_internal.h"
#include "veloxquant/dtype.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"


namespace veloxquant {

// ---- PQSpec -------------------------------------------------------------------------------

PQSpec PQSpec::parse(const std::string& s) {
  auto fail = [&]() {
    VQ_THROW(ValueError, "invalid PQ spec \"" << s
                                              << "\": expected d<sub_dim>b<codebook_bits> with both in 1..16, "
                                                 "e.g. \"d4b8\"");
  };
  size_t i = 0;
  auto read_int = [&](int& out) {
    const size_t start = i;
    int v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 6) v = v * 10 + (s[i++] - '0');
    if (i == start) fail();
    out = v;
  };
  PQSpec p;
  if (s.empty() || (s[0] != 'd' && s[0] != 'D')) fail();
  ++i;
  read_int(p.sub_dim);
  if (i >= s.size() || (s[i] != 'b' && s[i] != 'B')) fail();
  ++i;
  read_int(p.codebook_bits);
  if (i != s.size()) fail();
  if (p.sub_dim < 1 || p.sub_dim > 16 || p.codebook_bits < 1 || p.codebook_bits > 16) fail();
  return p;
}

std::string PQSpec::str() const {
  std::ostringstream o;
  o << 'd' << sub_dim << 'b' << codebook_bits;
  return o.str();
}

// ---- ProductQuantizer ---------------------------------------------------------------------

ProductQuantizer::ProductQuantizer(int head_dim_, PQSpec spec, std::vector<float> cb) {
  VQ_CHECK_VALUE(spec.sub_dim >= 1 && spec.sub_dim <= 16,
                 "ProductQuantizer: sub_dim must be in 1..16, got " << spec.sub_dim);
  VQ_CHECK_VALUE(spec.codebook_bits >= 1 && spec.codebook_bits <= 16,
                 "ProductQuantizer: codebook_bits must be in 1..16, got " << spec.codebook_bits);
  VQ_CHECK_VALUE(head_dim_ >= 1, "ProductQuantizer: head_dim must be >= 1, got " << head_dim_);
  VQ_CHECK_VALUE(head_dim_ % spec.sub_dim == 0, "ProductQuantizer: head_dim (" << head_dim_
                                                    << ") must be a multiple of sub_dim (" << spec.sub_dim
                                                    << ") for " << spec.str());
  head_dim = head_dim_;
  sub_dim = spec.sub_dim;
  codebook_bits = spec.codebook_bits;
  n_sub = head_dim / sub_dim;
  n_centroids = 1 << codebook_bits;
  code_bytes = packed_row_bytes(n_sub, codebook_bits);
  if (!cb.empty()) set_codebook(std::move(cb));
}

void ProductQuantizer::set_codebook(std::vector<float> cb) {
  VQ_CHECK_VALUE(sub_dim >= 1 && n_centroids >= 2, "set_codebook: the quantizer is not initialised");
  VQ_CHECK_SHAPE(cb.size() == size_t(n_centroids) * size_t(sub_dim),
                 "codebook: expected [n_centroids=" << n_centroids << ", sub_dim=" << sub_dim
                                                    << "] = " << size_t(n_centroids) * sub_dim << " floats, got "
                                                    << cb.size());
  for (size_t i = 0; i < cb.size(); ++i)
    VQ_CHECK_VALUE(std::isfinite(cb[i]),
                   "codebook[" << i / sub_dim << "][" << i % sub_dim << "] is " << cb[i] << ": must be finite");
  std::vector<float> norms(static_cast<size_t>(n_centroids));
  for (int c = 0; c < n_centroids; ++c) {
    float acc = 0.0f;
    for (int j = 0; j < sub_dim; ++j) acc += cb[size_t(c) * sub_dim + j] * cb[size_t(c) * sub_dim + j];
    norms[size_t(c)] = acc;
  }
  codebook = std::move(cb);
  centroid_norms = std::move(norms);
  // the int8 form, only when it is exact (every entry byte·scale, bit for bit)
  I8Codebook i8 = make_i8_codebook(codebook);
  if (i8.decoded == codebook) {
    codebook_i8 = std::move(i8.bytes);
    codebook_i8_scale = i8.scale;
  } else {
    codebook_i8.clear();
    codebook_i8_scale = 0.0f;
  }
}

void ProductQuantizer::set_random_codebook(uint64_t seed, float stddev) {
  VQ_CHECK_VALUE(sub_dim >= 1 && n_centroids >= 2, "set_random_codebook: the quantizer is not initialised");
  // splitmix64 + Box–Muller: the same codebook for a seed on every platform.
  uint64_t s = seed;
  auto next = [&]() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto uniform = [&]() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };  // (0, 1)
  std::vector<float> cb(size_t(n_centroids) * sub_dim);
  for (size_t i = 0; i < cb.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), th = 6.283185307179586 * uniform();
    cb[i] = float(stddev * r * std::cos(th));
    if (i + 1 < cb.size()) cb[i + 1] = float(stddev * r * std::sin(th));
  }
  set_codebook(std::move(cb));
}

// ---- encode ---------------------------------------------------------------------------------

namespace {
// x [n, head_dim] is x [n·n_sub, sub_dim]: one nearest-centroid search (search(x, points,
// assign)) over all sub-vectors, then pack each row. Done in slabs of rows to bound the index
// scratch.
template <typename Search>
void encode_rows(const ProductQuantizer& pq, const float* x, int64_t n, uint8_t* codes, const char* what,
                 Search&& search) {
  detail::pq_check_ready(pq, what);
  VQ_CHECK_VALUE(n >= 0, what << ": n must be >= 0, got " << n);
  if (n == 0) return;
  const int64_t slab = std::max<int64_t>(1, 65536 / pq.n_sub);
  std::vector<int32_t> idx(size_t(std::min(n, slab) * pq.n_sub));
  for (int64_t r0 = 0; r0 < n; r0 += slab) {
    const int64_t rows = std::min(slab, n - r0);
    search(x + r0 * pq.head_dim, rows * pq.n_sub, idx.data());
    pack_codes(reinterpret_cast<const uint32_t*>(idx.data()), rows, pq.n_sub, pq.codebook_bits,
               codes + r0 * pq.code_bytes);
  }
}
}  // namespace

void ProductQuantizer::encode(const float* x, int64_t n, uint8_t* codes, int n_threads) const {
  encode_rows(*this, x, n, codes, "ProductQuantizer::encode", [&](const float* xs, int64_t m, int32_t* idx) {
    detail::nearest_centroids(xs, m, sub_dim, codebook.data(), n_centroids, idx, nullptr, n_threads);
  });
}

void detail::pq_encode_prepared(const ProductQuantizer& pq, const PreparedCentroids& p, const float* x, int64_t n,
                                uint8_t* codes, int n_threads) {
  encode_rows(pq, x, n, codes, "pq_encode_prepared", [&](const float* xs, int64_t m, int32_t* idx) {
    detail::nearest_centroids(p, xs, m, pq.sub_dim, pq.codebook.data(), pq.n_centroids, idx, nullptr, n_threads);
  });
}

// ---- decode / LUT ---------------------------------------------------------------------------

void ProductQuantizer::decode(const uint8_t* codes, int64_t n, float* x) const {
  detail::pq_check_ready(*this, "ProductQuantizer::decode");
  VQ_CHECK_VALUE(n >= 0, "ProductQuantizer::decode: n must be >= 0, got " << n);
  const int d = sub_dim, bits = codebook_bits;
  const float* cb = codebook.data();
  for (int64_t v = 0; v < n; ++v) {
    const uint8_t* row = codes + v * code_bytes;
    float* out = x + v * head_dim;
    if (bits == 8) {
      for (int m = 0; m < n_sub; ++m) std::memcpy(out + m * d, cb + size_t(row[m]) * d, sizeof(float) * d);
    } else {
      for (int m = 0; m < n_sub; ++m)
        std::memcpy(out + m * d, cb + size_t(read_code(row, m, bits)) * d, sizeof(float) * d);
    }
  }
}

void ProductQuantizer::compute_lut(const float* q, float* lut) const {
  detail::pq_check_ready(*this, "ProductQuantizer::compute_lut");
  const int d = sub_dim, K = n_centroids;
  const float* cb = codebook.data();
  for (int m = 0; m < n_sub; ++m) {
    const float* qm = q + m * d;
    float* out = lut + size_t(m) * K;
    for (int c = 0; c < K; ++c) {
      const float* cc = cb + size_t(c) * d;
      float acc = 0.0f;
      for (int j = 0; j < d; ++j) acc += qm[j] * cc[j];
      out[c] = acc;
    }
  }
}

// ---- bit packing ----------------------------------------------------------------------------

void pack_codes(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, uint8_t* out) {
  detail::pq_check_pack_args(n_rows, n_codes, bits, "pack_codes");
  detail::pq_check_code_range(idx, n_rows, n_codes, bits, "pack_codes");
  const int64_t rb = packed_row_bytes(n_codes, bits);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint32_t* in = idx + r * n_codes;
    uint8_t* o = out + r * rb;
    if (bits == 8) {
      for (int64_t i = 0; i < n_codes; ++i) o[i] = uint8_t(in[i]);
      continue;
    }
    if (bits == 16) {
      for (int64_t i = 0; i < n_codes; ++i) {
        o[2 * i] = uint8_t(in[i]);
        o[2 * i + 1] = uint8_t(in[i] >> 8);
      }
      continue;
    }
    // 64-bit accumulator, flushed a byte at a time; the last partial byte is zero-padded
    uint64_t acc = 0;
    int nacc = 0;
    int64_t ob = 0;
    for (int64_t i = 0; i < n_codes; ++i) {
      acc |= uint64_t(in[i]) << nacc;
      nacc += bits;
      while (nacc >= 8) {
        o[ob++] = uint8_t(acc);
        acc >>= 8;
        nacc -= 8;
      }
    }
    if (nacc > 0) o[ob++] = uint8_t(acc);
  }
}

void unpack_codes(const uint8_t* packed, int64_t n_rows, int64_t n_codes, int bits, uint32_t* idx) {
  detail::pq_check_pack_args(n_rows, n_codes, bits, "unpack_codes");
  const int64_t rb = packed_row_bytes(n_codes, bits);
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* p = packed + r * rb;
    uint32_t* o = idx + r * n_codes;
    if (bits == 8) {
      for (int64_t i = 0; i < n_codes; ++i) o[i] = p[i];
      continue;
    }
    uint64_t acc = 0;
    int nacc = 0;
    int64_t ib = 0;
    for (int64_t i = 0; i < n_codes; ++i) {
      while (nacc < bits) {
        acc |= uint64_t(p[ib++]) << nacc;
        nacc += 8;
      }
      o[i] = uint32_t(acc) & mask;
      acc >>= bits;
      nacc -= bits;
    }
  }
}

namespace {
/// max |c| over a codebook that must be finite (ValueError naming the element otherwise).
float finite_max_abs(const std::vector<float>& codebook, const char* what) {
  float mx = 0.0f;
  for (size_t i = 0; i < codebook.size(); ++i) {
    VQ_CHECK_VALUE(std::isfinite(codebook[i]),
                   what << ": element " << i << " of " << codebook.size() << " is not finite (" << codebook[i] << ")");
    mx = std::max(mx, std::fabs(codebook[i]));
  }
  return mx;
}
}  // namespace

E4M3Codebook make_e4m3_codebook(const std::vector<float>& codebook) {
  const float mx = finite_max_abs(codebook, "E4M3 codebook");
  E4M3Codebook r;
  r.scale = e4m3_codebook_scale(mx);
  r.bytes.resize(codebook.size());
  r.decoded.resize(codebook.size());
  for (size_t i = 0; i < codebook.size(); ++i) {
    r.bytes[i] = float_to_e4m3(codebook[i] * r.scale);  // exact product: a power of two
    r.decoded[i] = e4m3_to_float(r.bytes[i]) / r.scale;
  }
  return r;
}

I8Codebook make_i8_codebook(const std::vector<float>& codebook) {
  const float mx = finite_max_abs(codebook, "int8 codebook");
  I8Codebook r;
  r.scale = mx / 127.0f;
  // a codebook of subnormals below 127 × the smallest subnormal has a scale that underflows
  // to 0 (and 0/0 is NaN): it holds nothing an int8 grid can tell from zero
  if (r.scale == 0.0f) r.scale = 1.0f;
  r.bytes.resize(codebook.size());
  r.decoded.resize(codebook.size());
  for (size_t i = 0; i < codebook.size(); ++i) {
    const float q = std::nearbyint(codebook[i] / r.scale);  // round to nearest even (the default mode)
    r.bytes[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    r.decoded[i] = float(r.bytes[i]) * r.scale;
  }
  return r;
}

std::vector<float> snap_to_int8_grid(const std::vector<float>& codebook) {
  // n·s with s recomputed from the snapped maximum (127·s) can land one ulp away from the first
  // pass's values; iterating to the fixed point makes the result stable under snapping again
  // (a restored cache snaps its saved codebook once more)
  std::vector<float> c = make_i8_codebook(codebook).decoded;
  for (int it = 0; it < 8; ++it) {
    std::vector<float> next = make_i8_codebook(c).decoded;
    if (next == c) return c;
    c = std::move(next);
  }
  VQ_THROW(ValueError, "snap_to_int8_grid: no fixed point after 8 passes (max |c| = "
                           << finite_max_abs(codebook, "int8 grid") << ")");
}

std::vector<uint8_t> i8_offset_binary(const I8Codebook& cb) {
  std::vector<uint8_t> u(cb.bytes.size());
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint8_t>(int(cb.bytes[i]) + 128);
  return u;
}

}  // namespace veloxquant
