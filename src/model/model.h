// The MiniCPM-SALA forward pass over a packed batch (design notes: one forward for prefill,
// chunked prefill, decode, batched decode and speculative verify). Layers are written once
// against the Backend interface.
#pragma once
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

 private:
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
};

}  // namespace sala
