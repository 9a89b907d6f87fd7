// model.cpp — loading a Llama-family checkpoint and its forward pass (see model.h).
#include "veloxquant/runtime/model.h"

#include <algorithm>
#include <cmath>

#include "veloxquant/artifact.h"
#include "veloxquant/attention.h"
#include "veloxquant/error.h"

namespace veloxquant::runtime {

const char* attention_path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::Auto: return "auto";
    case AttentionPath::Fetch: return "fetch";
    case AttentionPath::Fused: return "fused";
  }
  return "?";
}

namespace {

std::string layer_name(int i, const std::string& rest) { return "model.layers." + std::to_string(i) + "." + rest; }

// Optional bias: present -> checked vector; absent -> empty, or an error when `required`.
std::vector<float> bias_of(const WeightStore& ws, const std::string& name, int64_t n, bool required) {
  if (ws.contains(name)) return ws.vector_f32(name, n);
  if (required) VQ_THROW(FormatError, "checkpoint: config.json asks for biases but there is no tensor named '" << name << "'");
  return {};
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void round_through(float* x, int64_t n, DType t) {
  if (t == DType::F16) {
    for (int64_t i = 0; i < n; ++i) x[i] = round_to_half(x[i]);
  } else if (t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
  }
}

AttentionPath resolve_path(AttentionPath requested, const KVCache& cache) {
  if (requested != AttentionPath::Auto) return requested;
  const KVCacheConfig& cfg = cache.config();
  if (cfg.kind == CacheKind::FP16) return AttentionPath::Fused;
  return cfg.mode() == CacheMode::MemoryBound ? AttentionPath::Fused : AttentionPath::Fetch;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->config_ = load_model_config(dir);
  m->gen_config_ = load_generation_config(dir);
  m->weights_ = WeightStore::open(dir);
  const ModelConfig& c = m->config_;
  const WeightStore& ws = m->weights_;
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, I = c.intermediate_size;

  m->rope_ = compute_rope_frequencies(c);
  m->embed_ = ws.matrix("model.embed_tokens.weight", c.vocab_size, H);
  m->final_norm_ = ws.vector_f32("model.norm.weight", H);
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
  } else {
    if (!ws.contains("lm_head.weight"))
      VQ_THROW(FormatError, "checkpoint: no tensor named 'lm_head.weight' and tie_word_embeddings is false");
    m->lm_head_ = ws.matrix("lm_head.weight", c.vocab_size, H);
  }
  m->layers_.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& L = m->layers_[size_t(i)];
    L.input_norm = ws.vector_f32(layer_name(i, "input_layernorm.weight"), H);
    L.post_norm = ws.vector_f32(layer_name(i, "post_attention_layernorm.weight"), H);
    L.wq = ws.matrix(layer_name(i, "self_attn.q_proj.weight"), nh * hd, H);
    L.wk = ws.matrix(layer_name(i, "self_attn.k_proj.weight"), nkv * hd, H);
    L.wv = ws.matrix(layer_name(i, "self_attn.v_proj.weight"), nkv * hd, H);
    L.wo = ws.matrix(layer_name(i, "self_attn.o_proj.weight"), H, nh * hd);
    L.bq = bias_of(ws, layer_name(i, "self_attn.q_proj.bias"), nh * hd, c.attention_bias);
    L.bk = bias_of(ws, layer_name(i, "self_attn.k_proj.bias"), nkv * hd, c.attention_bias);
    L.bv = bias_of(ws, layer_name(i, "self_attn.v_proj.bias"), nkv * hd, c.attention_bias);
    L.bo = bias_of(ws, layer_name(i, "self_attn.o_proj.bias"), H, c.attention_o_bias);
    if (!c.attention_bias && (!L.bq.empty() || !L.bk.empty() || !L.bv.empty()))
      VQ_THROW(FormatError, "checkpoint: layer " << i << " has q/k/v biases but config.json's attention_bias is false");
    if (!c.attention_o_bias && !L.bo.empty())
      VQ_THROW(FormatError, "checkpoint: layer " << i << " has an o_proj bias that " << arch_name(c.arch)
                                                << " with this config does not use");
    if (c.qk_norm) {
      L.q_norm = ws.vector_f32(layer_name(i, "self_attn.q_norm.weight"), hd);
      L.k_norm = ws.vector_f32(layer_name(i, "self_attn.k_norm.weight"), hd);
    }
    L.w_gate = ws.matrix(layer_name(i, "mlp.gate_proj.weight"), I, H);
    L.w_up = ws.matrix(layer_name(i, "mlp.up_proj.weight"), I, H);
    L.w_down = ws.matrix(layer_name(i, "mlp.down_proj.weight"), H, I);
    L.b_gate = bias_of(ws, layer_name(i, "mlp.gate_proj.bias"), I, c.mlp_bias);
    L.b_up = bias_of(ws, layer_name(i, "mlp.up_proj.bias"), I, c.mlp_bias);
    L.b_down = bias_of(ws, layer_name(i, "mlp.down_proj.bias"), H, c.mlp_bias);
  }
  m->pool_ = std::make_shared<ThreadPool>(options.n_threads);
  return m;
}

SdpaParams Model::sdpa_params() const {
  SdpaParams p;
  p.scale = float(config_.attn_scale());
  p.causal = true;
  p.sliding_window = config_.sliding_window;
  p.n_threads = pool_->size();
  return p;
}

int64_t Model::fp16_kv_bytes(int64_t n_tokens) const {
  return 2 * int64_t(config_.n_layers) * config_.n_kv_heads * config_.head_dim * 2 * n_tokens;
}

std::vector<float> Model::forward(std::span<const int32_t> tokens, LayerCaches& caches,
                                  const ForwardOptions& options) const {
  return run(tokens, &caches, DType::F32, options);
}

std::vector<float> Model::forward_nocache(std::span<const int32_t> tokens, DType kv_dtype, bool all_logits,
                                          const KVObserver& observer) const {
  VQ_CHECK_VALUE(kv_dtype == DType::F32 || kv_dtype == DType::F16 || kv_dtype == DType::BF16,
                 "forward_nocache: kv_dtype must be f32, f16 or bf16, got " << dtype_name(kv_dtype));
  ForwardOptions o;
  o.all_logits = all_logits;
  o.observer = observer;
  return run(tokens, nullptr, kv_dtype, o);
}

std::vector<float> Model::run(std::span<const int32_t> tokens, LayerCaches* caches, DType kv_dtype,
                              const ForwardOptions& options) const {
  const ModelConfig& c = config_;
  const int64_t T = int64_t(tokens.size());
  VQ_CHECK_VALUE(T > 0, "forward: no tokens");
  int64_t start = 0;
  if (caches) {
    VQ_CHECK_VALUE(int64_t(caches->size()) == c.n_layers,
                   "forward: expected " << c.n_layers << " caches (one per layer), got " << caches->size());
    for (size_t i = 0; i < caches->size(); ++i) {
      VQ_CHECK_VALUE((*caches)[i] != nullptr, "forward: cache of layer " << i << " is null");
      VQ_CHECK_VALUE((*caches)[i]->offset() == (*caches)[0]->offset(),
                     "forward: cache offsets disagree: layer 0 holds " << (*caches)[0]->offset() << " tokens, layer "
                                                                       << i << " holds " << (*caches)[i]->offset());
    }
    start = (*caches)[0]->offset();
  }
  for (int64_t t = 0; t < T; ++t)
    VQ_CHECK_VALUE(tokens[t] >= 0 && tokens[t] < c.vocab_size,
                   "forward: token id " << tokens[t] << " at index " << t << " is outside the vocabulary [0, "
                                        << c.vocab_size << ")");

  const int64_t H = c.hidden_size, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim, I = c.intermediate_size;
  const float eps = float(c.rms_norm_eps);
  ThreadPool* pool = pool_.get();
  std::vector<float> x(size_t(T * H)), h(size_t(T * H));
  std::vector<float> q(size_t(T * nh * hd)), k(size_t(T * nkv * hd)), v(size_t(T * nkv * hd));
  std::vector<float> att(size_t(T * nh * hd));
  std::vector<float> g(size_t(T * I)), u(size_t(T * I));
  embedding_lookup(embed_, tokens.data(), T, x.data());
  const RopeTable rt = make_rope_table(rope_.inv_freq, rope_.attention_factor, start, T);
  const SdpaParams sp = sdpa_params();

  // Activation layout [n_tokens, heads, head_dim] seen as [batch=1, heads, n_tokens, head_dim].
  auto heads_view = [T, hd](float* p, int64_t heads) {
    return TensorView(p, DType::F32, {1, heads, T, hd}, {T * heads * hd, hd, heads * hd, 1});
  };
  int layers_updated = 0;
  try {
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = layers_[size_t(l)];
      rmsnorm(x.data(), T, H, L.input_norm.data(), eps, h.data());
      matmul(h.data(), T, L.wq, L.bq.empty() ? nullptr : L.bq.data(), q.data(), pool);
      matmul(h.data(), T, L.wk, L.bk.empty() ? nullptr : L.bk.data(), k.data(), pool);
      matmul(h.data(), T, L.wv, L.bv.empty() ? nullptr : L.bv.data(), v.data(), pool);
      if (c.qk_norm) {
        rmsnorm(q.data(), T * nh, hd, L.q_norm.data(), eps, q.data());
        rmsnorm(k.data(), T * nkv, hd, L.k_norm.data(), eps, k.data());
      }
      rope_apply(q.data(), T, int(nh), int(hd), rt);
      rope_apply(k.data(), T, int(nkv), int(hd), rt);
      if (options.observer) options.observer(l, k.data(), v.data(), T);

      const TensorView qv = heads_view(q.data(), nh);
      const TensorView kv = heads_view(k.data(), nkv);
      const TensorView vv = heads_view(v.data(), nkv);
      const TensorView ov = heads_view(att.data(), nh);
      if (!caches) {
        round_through(k.data(), T * nkv * hd, kv_dtype);
        round_through(v.data(), T * nkv * hd, kv_dtype);
        attention_cpu(qv, kv, vv, ov, sp, pool);
      } else {
        KVCache& cache = *(*caches)[size_t(l)];
        if (resolve_path(options.path, cache) == AttentionPath::Fused) {
          cache.update(kv, vv);
          ++layers_updated;
          cache.fused_sdpa_into(qv, ov, sp);
        } else {
          auto [K, V] = cache.update_and_fetch(kv, vv);
          ++layers_updated;
          attention_cpu(qv, K.view(), V.view(), ov, sp, pool);
        }
      }
      matmul(att.data(), T, L.wo, L.bo.empty() ? nullptr : L.bo.data(), h.data(), pool);
      add_inplace(x.data(), h.data(), T * H);

      rmsnorm(x.data(), T, H, L.post_norm.data(), eps, h.data());
      matmul(h.data(), T, L.w_gate, L.b_gate.empty() ? nullptr : L.b_gate.data(), g.data(), pool);
      matmul(h.data(), T, L.w_up, L.b_up.empty() ? nullptr : L.b_up.data(), u.data(), pool);
      silu_mul(g.data(), u.data(), T * I, g.data());
      matmul(g.data(), T, L.w_down, L.b_down.empty() ? nullptr : L.b_down.data(), h.data(), pool);
      add_inplace(x.data(), h.data(), T * H);
    }
  } catch (...) {
    // Leave the caches as they were: drop what this call appended.
    if (caches) {
      for (int l = 0; l < layers_updated; ++l) {
        try {
          (*caches)[size_t(l)]->trim(T);
        } catch (...) {
        }
      }
    }
    throw;
  }

  const int64_t rows = options.all_logits ? T : 1;
  const float* last = x.data() + (T - rows) * H;
  rmsnorm(last, rows, H, final_norm_.data(), eps, h.data());
  std::vector<float> logits(size_t(rows * c.vocab_size));
  matmul(h.data(), rows, lm_head_, nullptr, logits.data(), pool);
  return logits;
}

// ---- caches --------------------------------------------------------------------------------

KVCacheConfig cache_config_for(const Model& model, const CacheOptions& o) {
  const ModelConfig& c = model.config();
  KVCacheConfig k;
  k.kind = o.kind;
  k.head_dim = c.head_dim;
  k.n_kv_heads = c.n_kv_heads;
  k.storage_dtype = o.storage_dtype;
  k.n_threads = o.n_threads;
  k.residual_length = o.residual_length;
  k.key_sub_dim = o.key_spec.sub_dim;
  k.key_codebook_bits = o.key_spec.codebook_bits;
  k.value_sub_dim = o.value_spec.sub_dim;
  k.value_codebook_bits = o.value_spec.codebook_bits;
  k.seed = o.seed;
  k.attention_codebooks = o.attention_codebooks;
  k.int8_key_grid = o.int8_key_grid;
  // One set of threads for every layer (the model runs them one after another): the model's
  // own pool, or one pool of the requested size.
  k.thread_pool = (o.n_threads == 0 || o.n_threads == model.pool().size()) ? model.shared_pool()
                                                                          : std::make_shared<ThreadPool>(o.n_threads);
  k.fused_sdpa = o.mode != CacheMode::Standard;
  k.fused_sdpa_memory_bound = o.mode == CacheMode::MemoryBound;
  return k;
}

LayerCaches make_caches(const Model& model, const CacheOptions& options) {
  if (options.kind == CacheKind::VecInfer && !options.artifact_path.empty()) {
    const Artifact a = Artifact::load(options.artifact_path);
    return make_caches(model, options, a);
  }
  LayerCaches caches;
  const KVCacheConfig base = cache_config_for(model, options);
  for (int i = 0; i < model.config().n_layers; ++i) {
    KVCacheConfig k = base;
    k.seed = options.seed + uint64_t(i);
    caches.push_back(KVCacheFactory::create(k));
  }
  return caches;
}

LayerCaches make_caches(const Model& model, const CacheOptions& options, const Artifact& a) {
  const ModelConfig& c = model.config();
  VQ_CHECK_VALUE(a.n_layers == c.n_layers && a.n_kv_heads == c.n_kv_heads && a.head_dim == c.head_dim,
                 "artifact does not fit the model: artifact has " << a.n_layers << " layers, " << a.n_kv_heads
                                                                  << " kv heads, head_dim " << a.head_dim
                                                                  << "; model has " << c.n_layers << " layers, "
                                                                  << c.n_kv_heads << " kv heads, head_dim "
                                                                  << c.head_dim);
  CacheOptions o = options;
  o.kind = CacheKind::VecInfer;
  const KVCacheConfig base = cache_config_for(model, o);
  LayerCaches caches;
  for (int i = 0; i < c.n_layers; ++i) caches.push_back(create_cache_from_artifact(a, i, base));
  return caches;
}

int64_t caches_nbytes(const LayerCaches& caches) {
  int64_t s = 0;
  for (const auto& c : caches) s += c->nbytes();
  return s;
}

void trim_caches(LayerCaches& caches, int64_t n) {
  for (auto& c : caches) c->trim(n);
}

}  // namespace veloxquant::runtime
