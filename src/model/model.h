// The MiniCPM-SALA forward pass over a packed batch (design notes: one forward for prefill,
// chunked prefill, decode, batched decode and speculative verify). Layers are written once
// against the Backend interface.
#pragma once
#include <array>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace sala {

struct ModelLimits {
  int64_t max_batch_tokens = 512;  // largest packed batch (prefill chunk + decode rows) per forward
  int64_t max_logit_rows = 64;     // rows whose logits one forward can return
};

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, Backend& backend, ModelLimits limits = {});
  const ModelConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  Backend& backend() { return backend_; }
  const ModelWeights& weights() const { return weights_; }

  // Cache geometry for this model with the given pool sizes.
  CacheSpec cache_spec(int max_pages, int max_slots) const;

  // Runs the batch through every layer, updating the caches of its sequences, and writes f32
  // logits of the requested packed rows to `logits` ([rows.size(), vocab], host memory).
  // `n_layers` < num_layers runs only the first layers (self-speculative drafting).
  void forward(const BatchInfo& batch, std::span<const int64_t> logit_rows, std::span<float> logits,
               int n_layers = -1);

  // Debugging/tests: when set, forward() appends the RMS of the residual stream after the
  // embedding and after every layer (a download per layer; never set in serving).
  void trace_layer_rms(std::vector<double>* out) { trace_rms_ = out; }

  // Speculative decoding (spec §6.2): while on, forward() copies the k and v rows of every
  // lightning layer it runs — post-norm/RoPE, exactly as fed to lightning_attention — for the
  // first min(N, max_rows) packed rows of the batch into a capture buffer (two gather_rows per
  // lightning layer; nothing at all when off). Engine::rollback reads them back.
  void capture_lightning_kv(bool on, int64_t max_rows = 64);
  bool capturing() const { return capture_on_; }
  int64_t captured_rows() const { return captured_rows_; }  // rows captured by the last forward
  int captured_layers() const { return captured_layers_; }  // lightning layers it ran
  Mat captured_k(int lightning_layer) const;  // [captured_rows, kv width] in backend memory
  Mat captured_v(int lightning_layer) const;

 private:
  void project(const Mat& x, const std::array<Backend::MatmulPart, 4>& parts, size_t count);
  void lightning_mixer(int layer, const LayerWeights& w, const Mat& x, Mat out, int64_t n);
  void sparse_mixer(int layer, const LayerWeights& w, const Mat& x, Mat out, int64_t n);

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  ModelLimits limits_;
  std::vector<double>* trace_rms_ = nullptr;
  // Workspace, sized at construction for max_batch_tokens rows.
  std::unique_ptr<Buffer> ws_;
  Mat h_, x_, q_, k_, v_, z_, attn_, mix_, gate_, up_, act_, logits_in_, logits_out_;
  // Lightning k/v capture (off unless capture_lightning_kv(true)).
  bool capture_on_ = false;
  int64_t capture_cap_ = 0, captured_rows_ = 0;
  int captured_layers_ = 0;
  std::unique_ptr<Buffer> capture_buf_;
  std::vector<Mat> cap_k_, cap_v_;  // per lightning layer
  std::vector<int64_t> capture_index_;
};

}  // namespace sala
