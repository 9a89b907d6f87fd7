// model_cuda.cpp — CudaModel (model_cuda.h): describes a loaded Model to the device decoder
// (core/cuda_decoder.h, src/cuda/runtime_decoder.cu) and keeps its RoPE table in step with the
// positions asked for. The weights are read through the Model's WeightStore by their Hugging
// Face names, with the same shapes Model::load checked.
#include "veloxquant/runtime/model_cuda.h"

#include <algorithm>

#include "core/cuda_decoder.h"
#include "veloxquant/artifact.h"
#include "veloxquant/error.h"

namespace veloxquant::runtime {

namespace {

std::string layer_name(int i, const std::string& rest) { return "model.layers." + std::to_string(i) + "." + rest; }

detail::HostMatrix host_matrix(const WeightStore& ws, const std::string& name, int64_t rows, int64_t cols) {
  const WeightView w = ws.matrix(name, rows, cols);
  return {w.data, w.dtype, w.rows, w.cols};
}

std::vector<float> optional_vec(const WeightStore& ws, const std::string& name, int64_t n) {
  return ws.contains(name) ? ws.vector_f32(name, n) : std::vector<float>{};
}

bool resolve_fetch(AttentionPath requested, const KVCache& cache) {
  if (requested != AttentionPath::Auto) return requested == AttentionPath::Fetch;
  const KVCacheConfig& cfg = cache.config();
  if (cfg.kind == CacheKind::FP16) return false;
  return cfg.mode() != CacheMode::MemoryBound;
}

}  // namespace

CudaModel::CudaModel(const Model& model, const CudaModelOptions& options) : model_(model), options_(options) {}
CudaModel::~CudaModel() = default;

std::unique_ptr<CudaModel> CudaModel::create(const Model& model, const CudaModelOptions& options) {
  const ModelConfig& c = model.config();
  const WeightStore& ws = model.weights();
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, I = c.intermediate_size;
  detail::CudaDecoderDesc d;
  d.hidden = c.hidden_size;
  d.intermediate = c.intermediate_size;
  d.n_heads = c.n_heads;
  d.n_kv_heads = c.n_kv_heads;
  d.head_dim = c.head_dim;
  d.vocab = c.vocab_size;
  d.rms_eps = float(c.rms_norm_eps);
  d.qk_norm = c.qk_norm;
  d.weights_f32 = options.weights_f32;
  d.device = Device::cuda(options.device);
  d.embed = host_matrix(ws, "model.embed_tokens.weight", c.vocab_size, H);
  d.lm_head = c.tie_word_embeddings ? d.embed : host_matrix(ws, "lm_head.weight", c.vocab_size, H);
  d.final_norm = ws.vector_f32("model.norm.weight", H);
  for (int i = 0; i < c.n_layers; ++i) {
    detail::CudaDecoderLayerDesc L;
    L.input_norm = ws.vector_f32(layer_name(i, "input_layernorm.weight"), H);
    L.post_norm = ws.vector_f32(layer_name(i, "post_attention_layernorm.weight"), H);
    L.wq = host_matrix(ws, layer_name(i, "self_attn.q_proj.weight"), nh * hd, H);
    L.wk = host_matrix(ws, layer_name(i, "self_attn.k_proj.weight"), nkv * hd, H);
    L.wv = host_matrix(ws, layer_name(i, "self_attn.v_proj.weight"), nkv * hd, H);
    L.wo = host_matrix(ws, layer_name(i, "self_attn.o_proj.weight"), H, nh * hd);
    // Model::load already checked biases against config.json; take what is there.
    L.bq = optional_vec(ws, layer_name(i, "self_attn.q_proj.bias"), nh * hd);
    L.bk = optional_vec(ws, layer_name(i, "self_attn.k_proj.bias"), nkv * hd);
    L.bv = optional_vec(ws, layer_name(i, "self_attn.v_proj.bias"), nkv * hd);
    if (c.attention_o_bias) L.bo = optional_vec(ws, layer_name(i, "self_attn.o_proj.bias"), H);
    if (c.qk_norm) {
      L.q_norm = ws.vector_f32(layer_name(i, "self_attn.q_norm.weight"), hd);
      L.k_norm = ws.vector_f32(layer_name(i, "self_attn.k_norm.weight"), hd);
    }
    L.w_gate = host_matrix(ws, layer_name(i, "mlp.gate_proj.weight"), I, H);
    L.w_up = host_matrix(ws, layer_name(i, "mlp.up_proj.weight"), I, H);
    L.w_down = host_matrix(ws, layer_name(i, "mlp.down_proj.weight"), H, I);
    if (c.mlp_bias) {
      L.b_gate = optional_vec(ws, layer_name(i, "mlp.gate_proj.bias"), I);
      L.b_up = optional_vec(ws, layer_name(i, "mlp.up_proj.bias"), I);
      L.b_down = optional_vec(ws, layer_name(i, "mlp.down_proj.bias"), H);
    }
    d.layers.push_back(std::move(L));
  }
  std::unique_ptr<CudaModel> m(new CudaModel(model, options));
  m->dec_ = detail::create_cuda_decoder(d);
  m->dec_->set_graphs(options.cuda_graphs);
  m->ensure_rope(std::max<int64_t>(c.max_position_embeddings, 1));
  return m;
}

int64_t CudaModel::weight_bytes() const { return dec_->weight_bytes(); }

DecodeGraphStats CudaModel::graph_stats() const {
  const detail::CudaDecoder::GraphStats g = dec_->graph_stats();
  return {g.captures, g.instantiations, g.replays, g.eager_steps, g.kernel_nodes, g.off_reason, g.last_eager_reason};
}

void CudaModel::ensure_rope(int64_t n) const {
  if (n <= dec_->rope_positions()) return;
  // Grow geometrically so long generations rebuild the table only a few times.
  n = std::max(n, 2 * dec_->rope_positions());
  const RopeFrequencies& r = model_.rope();
  const RopeTable t = make_rope_table(r.inv_freq, r.attention_factor, 0, n);
  dec_->set_rope_table(t.cos, t.sin, n);
}

namespace {
void check_tokens(std::span<const int32_t> tokens, int vocab) {
  for (size_t t = 0; t < tokens.size(); ++t)
    VQ_CHECK_VALUE(tokens[t] >= 0 && tokens[t] < vocab, "forward: token id " << tokens[t] << " at index " << t
                                                                              << " is outside the vocabulary [0, "
                                                                              << vocab << ")");
}
}  // namespace

std::vector<float> CudaModel::forward(std::span<const int32_t> tokens, LayerCaches& caches,
                                      const ForwardOptions& options) const {
  const ModelConfig& c = model_.config();
  const int64_t T = int64_t(tokens.size());
  VQ_CHECK_VALUE(T > 0, "forward: no tokens");
  VQ_CHECK_VALUE(int64_t(caches.size()) == c.n_layers,
                 "forward: expected " << c.n_layers << " caches (one per layer), got " << caches.size());
  std::vector<KVCache*> raw;
  std::vector<bool> fetch;
  for (size_t i = 0; i < caches.size(); ++i) {
    VQ_CHECK_VALUE(caches[i] != nullptr, "forward: cache of layer " << i << " is null");
    VQ_CHECK_VALUE(caches[i]->offset() == caches[0]->offset(),
                   "forward: cache offsets disagree: layer 0 holds " << caches[0]->offset() << " tokens, layer " << i
                                                                     << " holds " << caches[i]->offset());
    raw.push_back(caches[i].get());
    fetch.push_back(resolve_fetch(options.path, *caches[i]));
  }
  check_tokens(tokens, c.vocab_size);
  const int64_t start = caches[0]->offset();
  ensure_rope(start + T);
  return dec_->forward(tokens.data(), T, start, raw, fetch, model_.sdpa_params(), options.all_logits, DType::F32,
                       options.observer);
}

std::vector<float> CudaModel::forward_nocache(std::span<const int32_t> tokens, DType kv_dtype, bool all_logits,
                                              const KVObserver& observer) const {
  VQ_CHECK_VALUE(!tokens.empty(), "forward_nocache: no tokens");
  VQ_CHECK_VALUE(kv_dtype == DType::F32 || kv_dtype == DType::F16 || kv_dtype == DType::BF16,
                 "forward_nocache: kv_dtype must be f32, f16 or bf16, got " << dtype_name(kv_dtype));
  check_tokens(tokens, model_.config().vocab_size);
  const int64_t T = int64_t(tokens.size());
  ensure_rope(T);
  return dec_->forward(tokens.data(), T, 0, {}, {}, model_.sdpa_params(), all_logits, kv_dtype, observer);
}

LayerCaches CudaModel::make_caches(const CacheOptions& options) const {
  const ModelConfig& c = model_.config();
  KVCacheConfig base = cache_config_for(model_, options);
  base.device = device();
  base.stream = dec_->stream();  // the decoder's (decode steps replay as graphs on it)
  LayerCaches caches;
  if (options.kind == CacheKind::VecInfer && !options.artifact_path.empty()) {
    const Artifact a = Artifact::load(options.artifact_path);
    VQ_CHECK_VALUE(a.n_layers == c.n_layers && a.n_kv_heads == c.n_kv_heads && a.head_dim == c.head_dim,
                   "artifact does not fit the model: artifact has "
                       << a.n_layers << " layers, " << a.n_kv_heads << " kv heads, head_dim " << a.head_dim
                       << "; model has " << c.n_layers << " layers, " << c.n_kv_heads << " kv heads, head_dim "
                       << c.head_dim);
    base.kind = CacheKind::VecInfer;
    for (int i = 0; i < c.n_layers; ++i) caches.push_back(create_cache_from_artifact(a, i, base));
    return caches;
  }
  for (int i = 0; i < c.n_layers; ++i) {
    KVCacheConfig k = base;
    k.seed = options.seed + uint64_t(i);
    caches.push_back(KVCacheFactory::create(k));
  }
  return caches;
}

}  // namespace veloxquant::runtime
