// prompt_cache.cpp — caches' state to and from one safetensors file (see prompt_cache.h).
#include "veloxquant/runtime/prompt_cache.h"

#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/vecinfer_cache.h"

namespace veloxquant::runtime {

namespace {
std::string layer_prefix(size_t i) { return "layers." + std::to_string(i) + "."; }
}  // namespace

void save_prompt_cache(const std::string& path, const LayerCaches& caches, std::span<const int32_t> tokens,
                       const std::map<std::string, std::string>& user) {
  VQ_CHECK_VALUE(!caches.empty(), "save_prompt_cache: no caches");
  const int64_t offset = caches[0]->offset();
  for (size_t i = 0; i < caches.size(); ++i)
    VQ_CHECK_VALUE(caches[i]->offset() == offset, "save_prompt_cache: cache " << i << " holds " << caches[i]->offset()
                                                                              << " tokens, cache 0 holds " << offset);
  VQ_CHECK_VALUE(int64_t(tokens.size()) == offset,
                 "save_prompt_cache: " << tokens.size() << " tokens given, the caches hold " << offset);

  std::vector<CacheState> states;  // keeps the tensors alive while views are written
  std::vector<NamedTensor> named;
  std::map<std::string, std::string> meta;
  meta["format"] = kPromptCacheFormat;
  meta["version"] = "1";
  meta["n_layers"] = std::to_string(caches.size());
  for (size_t i = 0; i < caches.size(); ++i) {
    states.push_back(caches[i]->state());
    for (const auto& [name, t] : states.back()) named.emplace_back(layer_prefix(i) + name, t.view());
    meta[layer_prefix(i) + "class"] = caches[i]->class_name();
    for (const auto& [k, v] : caches[i]->meta_state()) meta[layer_prefix(i) + "meta." + k] = v;
  }
  for (const auto& [k, v] : user) meta["user." + k] = v;
  std::vector<int32_t> tok(tokens.begin(), tokens.end());
  if (!tok.empty())
    named.emplace_back("tokens", TensorView(tok.data(), DType::I32, {int64_t(tok.size())}));
  save_safetensors(path, named, meta);
}

PromptCache load_prompt_cache(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  const auto fmt = f.metadata_value("format");
  VQ_CHECK_FORMAT(fmt && *fmt == kPromptCacheFormat,
                  path << ": not a veloxquant prompt cache (metadata 'format' is "
                       << (fmt ? "'" + *fmt + "'" : std::string("absent")) << ")");
  const auto ver = f.metadata_value("version");
  VQ_CHECK_FORMAT(ver && *ver == "1", path << ": unsupported prompt cache version " << (ver ? *ver : "<absent>"));
  const auto nl = f.metadata_value("n_layers");
  int64_t n_layers = -1;
  try {
    n_layers = nl ? std::stoll(*nl) : -1;
  } catch (...) {
  }
  VQ_CHECK_FORMAT(n_layers > 0 && n_layers <= 4096, path << ": bad n_layers metadata");

  PromptCache pc;
  for (const auto& [k, v] : f.metadata())
    if (k.rfind("user.", 0) == 0) pc.user[k.substr(5)] = v;
  if (f.contains("tokens")) {
    const TensorView t = f.tensor("tokens");
    VQ_CHECK_FORMAT(t.dtype == DType::I32 && t.ndim == 1, path << ": 'tokens' must be I32 [n], got "
                                                               << dtype_name(t.dtype) << " " << t.shape_string());
    const int32_t* p = t.ptr<int32_t>();
    pc.tokens.assign(p, p + t.dim(0));
  }
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string pre = layer_prefix(size_t(i));
    const auto cls = f.metadata_value(pre + "class");
    VQ_CHECK_FORMAT(cls.has_value(), path << ": missing metadata '" << pre << "class'");
    CacheMetaState meta;
    const std::string mpre = pre + "meta.";
    for (const auto& [k, v] : f.metadata())
      if (k.rfind(mpre, 0) == 0) meta[k.substr(mpre.size())] = v;
    CacheState state;
    for (const auto& name : f.names())
      if (name.rfind(pre, 0) == 0) state.emplace_back(name.substr(pre.size()), Tensor::copy_of(f.tensor(name)));
    try {
      if (*cls == "KVCache") {
        pc.caches.push_back(FP16KVCache::from_state(state, meta));
      } else if (*cls == "VecInferKVCache") {
        pc.caches.push_back(VecInferKVCache::from_state(state, meta));
      } else {
        VQ_THROW(FormatError, "unknown cache class '" << *cls << "'");
      }
    } catch (const Error& e) {
      VQ_THROW(FormatError, path << ": layer " << i << ": " << e.what());
    }
    VQ_CHECK_FORMAT(pc.caches.back()->offset() == int64_t(pc.tokens.size()),
                    path << ": layer " << i << " holds " << pc.caches.back()->offset() << " tokens but 'tokens' has "
                         << pc.tokens.size());
  }
  return pc;
}

void check_prompt_cache_fits(const PromptCache& pc, const Model& model) {
  const ModelConfig& c = model.config();
  VQ_CHECK_VALUE(int64_t(pc.caches.size()) == c.n_layers,
                 "prompt cache has " << pc.caches.size() << " layers, the model " << c.n_layers);
  for (size_t i = 0; i < pc.caches.size(); ++i) {
    const KVCache& k = *pc.caches[i];
    VQ_CHECK_VALUE(k.config().head_dim == c.head_dim && (k.empty() || k.n_kv_heads() == c.n_kv_heads),
                   "prompt cache layer " << i << " has head_dim " << k.config().head_dim << " and " << k.n_kv_heads()
                                         << " kv heads; the model has head_dim " << c.head_dim << " and "
                                         << c.n_kv_heads);
  }
  for (int32_t t : pc.tokens)
    VQ_CHECK_VALUE(t >= 0 && t < c.vocab_size, "prompt cache token " << t << " is outside the model's vocabulary");
}

}  // namespace veloxquant::runtime
