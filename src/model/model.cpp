// The forward pass (spec §2–§4). Every step is a backend op; the host only slices the workspace.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "core/error.h"

namespace sala {

Model::Model(ModelConfig config, ModelWeights weights, Backend& backend, ModelLimits limits)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(backend), limits_(limits) {
  const auto& c = config_;
  const int64_t N = limits_.max_batch_tokens, R = limits_.max_logit_rows;
  const int64_t attn_w = std::max<int64_t>(int64_t(c.num_heads) * c.head_dim,
                                           int64_t(c.lightning_heads) * c.lightning_head_dim);
  const int64_t kv_w = std::max<int64_t>(int64_t(c.num_kv_heads) * c.head_dim,
                                         int64_t(c.lightning_kv_heads) * c.lightning_head_dim);
  const DType act = backend_.act_dtype();
  // Layout of the one workspace buffer: each matrix at its own offset, 256-byte aligned.
  struct Slot { Mat* m; int64_t rows, cols; DType dt; };
  std::vector<Slot> slots = {
      {&h_, N, c.hidden_size, act},        {&x_, N, c.hidden_size, act},   {&q_, N, attn_w, act},
      {&k_, N, kv_w, act},                 {&v_, N, kv_w, act},            {&z_, N, attn_w, act},
      {&attn_, N, attn_w, act},            {&mix_, N, c.hidden_size, act}, {&gate_, N, c.intermediate_size, act},
      {&up_, N, c.intermediate_size, act}, {&act_, N, c.intermediate_size, act},
      {&logits_in_, R, c.hidden_size, act}, {&logits_out_, R, c.vocab_size, DType::F32}};
  size_t total = 0;
  std::vector<size_t> offsets;
  for (auto& s : slots) {
    offsets.push_back(total);
    total += (size_t(s.rows * s.cols) * dtype_size(s.dt) + 255) / 256 * 256;
  }
  ws_ = backend_.alloc(total);
  for (size_t i = 0; i < slots.size(); ++i)
    *slots[i].m = Mat{static_cast<uint8_t*>(ws_->data()) + offsets[i], slots[i].dt, slots[i].rows, slots[i].cols};
}

void Model::capture_lightning_kv(bool on, int64_t max_rows) {
  capture_on_ = on;
  captured_rows_ = 0;
  captured_layers_ = 0;
  if (!on) return;
  SALA_CHECK(max_rows > 0, "capture_lightning_kv: max_rows must be positive, got {}", max_rows);
  const auto& c = config_;
  const int nl = c.count(MixerKind::Lightning);
  if (capture_buf_ && capture_cap_ >= max_rows) return;
  capture_cap_ = max_rows;
  const int64_t kw = int64_t(c.lightning_kv_heads) * c.lightning_head_dim;
  const DType act = backend_.act_dtype();
  const size_t one = (size_t(max_rows * kw) * dtype_size(act) + 255) / 256 * 256;
  capture_buf_ = backend_.alloc(std::max<size_t>(1, one * 2 * size_t(nl)));
  cap_k_.clear();
  cap_v_.clear();
  auto* base = static_cast<uint8_t*>(capture_buf_->data());
  for (int i = 0; i < nl; ++i) {
    cap_k_.push_back(Mat{base + one * size_t(2 * i), act, max_rows, kw});
    cap_v_.push_back(Mat{base + one * size_t(2 * i + 1), act, max_rows, kw});
  }
  capture_index_.resize(size_t(max_rows));
  for (int64_t r = 0; r < max_rows; ++r) capture_index_[size_t(r)] = r;
}

Mat Model::captured_k(int lightning_layer) const {
  SALA_CHECK(lightning_layer >= 0 && lightning_layer < captured_layers_, "captured_k: lightning layer {} not captured",
             lightning_layer);
  return cap_k_[size_t(lightning_layer)].slice_rows(0, captured_rows_);
}

Mat Model::captured_v(int lightning_layer) const {
  SALA_CHECK(lightning_layer >= 0 && lightning_layer < captured_layers_, "captured_v: lightning layer {} not captured",
             lightning_layer);
  return cap_v_[size_t(lightning_layer)].slice_rows(0, captured_rows_);
}

CacheSpec Model::cache_spec(int max_pages, int max_slots) const {
  const auto& c = config_;
  CacheSpec s;
  s.sparse_layers = c.count(MixerKind::Sparse);
  s.kv_heads = c.num_kv_heads;
  s.q_heads = c.num_heads;
  s.head_dim = c.head_dim;
  s.block_size = c.sparse.block_size;
  s.kernel_size = c.sparse.kernel_size;
  s.kernel_stride = c.sparse.kernel_stride;
  s.init_blocks = c.sparse.init_blocks;
  s.local_blocks = c.sparse.local_blocks();
  s.topk = c.sparse.topk;
  s.max_pages = max_pages;
  s.lightning_layers = c.count(MixerKind::Lightning);
  s.lightning_heads = c.lightning_heads;
  s.lightning_dim = c.lightning_head_dim;
  s.log_decay = c.lightning_log_decay();
  s.lightning_scale = float(c.lightning_qk_scale());
  s.max_slots = max_slots;
  s.attn_scale = float(1.0 / std::sqrt(double(c.head_dim)));
  return s;
}

// The first `count` projections of x in one backend call (fused on backends that can).
void Model::project(const Mat& x, const std::array<Backend::MatmulPart, 4>& parts, size_t count) {
  backend_.matmul_group(x, std::span(parts).first(count));
}

// Lightning layer (spec §3): projections, per-head q/k RMSNorm, RoPE, Simple GLA, o_norm, z gate.
void Model::lightning_mixer(int layer, const LayerWeights& w, const Mat& x, Mat out, int64_t n) {
  const auto& c = config_;
  const int64_t qw = int64_t(c.lightning_heads) * c.lightning_head_dim;
  const int64_t kw = int64_t(c.lightning_kv_heads) * c.lightning_head_dim;
  Mat q = q_.slice_rows(0, n).reshape(n, qw), k = k_.slice_rows(0, n).reshape(n, kw);
  Mat v = v_.slice_rows(0, n).reshape(n, kw), attn = attn_.slice_rows(0, n).reshape(n, qw);
  Mat z = z_.slice_rows(0, n).reshape(n, qw);
  project(x, {{{&w.q, q}, {&w.k, k}, {&w.v, v}, {&w.z, z}}}, c.use_output_gate ? 4 : 3);
  Backend::LightningNorms norms;
  if (c.qk_norm) norms.q_norm = &w.q_norm, norms.k_norm = &w.k_norm;
  norms.rope = c.lightning_use_rope;
  norms.theta = c.rope_theta;
  norms.head_dim = c.lightning_head_dim;
  if (c.use_output_norm) norms.o_norm = &w.o_norm;
  if (c.use_output_gate) norms.z = &z;
  norms.eps = c.rms_norm_eps;
  if (capture_on_) {  // speculative verify: the post-norm/RoPE k, v rows are kept for rollback
    backend_.lightning_qk(q, k, norms);
    norms.q_norm = norms.k_norm = nullptr;
    norms.rope = false;
    const int li = config_.kind_index(layer);
    const int64_t m = std::min(n, capture_cap_);
    backend_.gather_rows(k, std::span(capture_index_).first(size_t(m)), cap_k_[size_t(li)].slice_rows(0, m));
    backend_.gather_rows(v, std::span(capture_index_).first(size_t(m)), cap_v_[size_t(li)].slice_rows(0, m));
    captured_rows_ = m;
    captured_layers_ = li + 1;
  }
  backend_.lightning_block(config_.kind_index(layer), q, k, v, norms, attn);
  backend_.matmul(attn, w.o, out);
}

// Sparse layer (spec §4): projections (NoPE unless attn_use_rope), InfLLM-v2 / dense attention
// with the caches, o_gate, o_proj.
void Model::sparse_mixer(int layer, const LayerWeights& w, const Mat& x, Mat out, int64_t n) {
  const auto& c = config_;
  const int64_t qw = int64_t(c.num_heads) * c.head_dim, kw = int64_t(c.num_kv_heads) * c.head_dim;
  Mat q = q_.slice_rows(0, n).reshape(n, qw), k = k_.slice_rows(0, n).reshape(n, kw);
  Mat v = v_.slice_rows(0, n).reshape(n, kw), attn = attn_.slice_rows(0, n).reshape(n, qw);
  Mat z = z_.slice_rows(0, n).reshape(n, qw);
  project(x, {{{&w.q, q}, {&w.k, k}, {&w.v, v}, {&w.o_gate, z}}}, c.attn_use_output_gate ? 4 : 3);
  if (c.attn_use_rope) {
    backend_.rope(q, c.head_dim, c.rope_theta);
    backend_.rope(k, c.head_dim, c.rope_theta);
  }
  backend_.sparse_block(config_.kind_index(layer), q, k, v, c.attn_use_output_gate ? &z : nullptr, attn);
  backend_.matmul(attn, w.o, out);
}

// Key of a decode-shaped forward for backend graph replay (0: not graphed). It fixes every op and
// shape the model issues: the token count, each sequence's packing, token count and regime, the
// logit rows (gather_rows passes them in the launch), the layers run and the lightning k/v capture
// (its gathers and buffers). The backend adds what it bakes into launches from begin_batch itself
// (work-item counts, metadata addresses). Sequences of several tokens are graphed only in verify
// forwards (capture on: at most kMaxVerifyRows each), which repeat their shapes every round; a
// prompt chunk rarely does.
static constexpr int64_t kMaxVerifyRows = 16;
static uint64_t decode_graph_key(const BatchInfo& batch, std::span<const int64_t> logit_rows, int n_layers,
                                 bool capture, std::initializer_list<const void*> identity) {
  const int64_t n = batch.n_tokens();
  if (n > 64 || logit_rows.empty()) return 0;
  if (!capture && int64_t(batch.seqs.size()) != n) return 0;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    h ^= uint64_t(v);
    h *= 1099511628211ull;
  };
  for (const void* p : identity) mix(int64_t(reinterpret_cast<uintptr_t>(p)));  // which model, capture buffers
  mix(n);
  mix(n_layers);
  mix(capture ? 1 : 0);
  for (const SeqEntry& e : batch.seqs) {
    if (e.n_new < 1 || e.n_new > (capture ? kMaxVerifyRows : 1)) return 0;
    mix(e.start);
    mix(e.n_new);
    mix(e.sparse ? 1 : 0);
  }
  mix(int64_t(logit_rows.size()));
  for (int64_t r : logit_rows) mix(r);
  return h | 1;
}

void Model::forward(const BatchInfo& batch, std::span<const int64_t> logit_rows, std::span<float> logits,
                    int n_layers) {
  const auto& c = config_;
  const int64_t n = batch.n_tokens();
  SALA_CHECK(n > 0, "forward: empty batch");
  SALA_CHECK(n <= limits_.max_batch_tokens, "forward: {} tokens exceed the workspace ({} tokens per call)", n,
             limits_.max_batch_tokens);
  SALA_CHECK(int64_t(logit_rows.size()) <= limits_.max_logit_rows, "forward: {} logit rows exceed the limit {}",
             logit_rows.size(), limits_.max_logit_rows);
  SALA_CHECK(logits.size() == logit_rows.size() * size_t(c.vocab_size), "forward: logits buffer has {} floats, need {}",
             logits.size(), logit_rows.size() * size_t(c.vocab_size));
  if (n_layers < 0) n_layers = c.num_layers;
  SALA_CHECK(n_layers <= c.num_layers, "forward: {} layers requested, model has {}", n_layers, c.num_layers);

  backend_.begin_batch(batch);
  captured_rows_ = 0;
  captured_layers_ = 0;
  // Decode and verify steps replay a recorded graph of everything up to the logits (not traced runs).
  const uint64_t gkey =
      trace_rms_ ? 0
                 : decode_graph_key(batch, logit_rows, n_layers, capture_on_,
                                    {ws_->data(), weights_.embed.w.data, weights_.lm_head.w.data,
                                     capture_on_ && capture_buf_ ? capture_buf_->data() : nullptr});
  if (gkey && backend_.graph_replay(gkey)) {
    if (capture_on_) {  // what the recorded lightning_mixer calls captured (rollback reads these)
      captured_rows_ = std::min(n, capture_cap_);
      for (int i = 0; i < n_layers; ++i)
        if (weights_.layers[size_t(i)].kind == MixerKind::Lightning) captured_layers_ = config_.kind_index(i) + 1;
    }
    backend_.download(logits_out_.slice_rows(0, int64_t(logit_rows.size())), logits.data());
    return;
  }
  if (gkey) backend_.graph_capture_begin(gkey);
  Mat h = h_.slice_rows(0, n), x = x_.slice_rows(0, n), mix = mix_.slice_rows(0, n);
  const float alpha = float(c.residual_scale());
  backend_.embed(weights_.embed, c.scale_emb, h);
  auto trace = [&] {
    if (!trace_rms_) return;
    std::vector<float> host(size_t(h.rows * h.cols));
    backend_.download(h, host.data());
    double ss = 0;
    for (float f : host) ss += double(f) * f;
    trace_rms_->push_back(std::sqrt(ss / double(host.size())));
  };
  trace();
  // Each residual update is fused with the norm that follows it (add_rmsnorm); the last layer's
  // stands alone, since the final norm runs only on the logit rows.
  if (n_layers > 0) backend_.rmsnorm(h, weights_.layers[0].input_norm, c.rms_norm_eps, x);
  for (int i = 0; i < n_layers; ++i) {
    const LayerWeights& w = weights_.layers[size_t(i)];
    if (w.kind == MixerKind::Sparse)
      sparse_mixer(i, w, x, mix, n);
    else
      lightning_mixer(i, w, x, mix, n);
    backend_.add_rmsnorm(h, mix, alpha, w.post_norm, c.rms_norm_eps, x);

    Mat g = gate_.slice_rows(0, n), u = up_.slice_rows(0, n), a = act_.slice_rows(0, n);
    backend_.matmul_silu_mul(x, w.gate, w.up, g, u, a);
    backend_.matmul(a, w.down, mix);
    if (i + 1 < n_layers)
      backend_.add_rmsnorm(h, mix, alpha, weights_.layers[size_t(i) + 1].input_norm, c.rms_norm_eps, x);
    else
      backend_.add_scaled(h, mix, alpha);
    trace();
  }
  if (logit_rows.empty()) return;

  // Only the rows whose logits are wanted go through the final norm and lm_head (spec §2.5).
  const int64_t r = int64_t(logit_rows.size());
  Mat sel = logits_in_.slice_rows(0, r), out = logits_out_.slice_rows(0, r);
  backend_.gather_rows(h, logit_rows, sel);
  backend_.rmsnorm(sel, weights_.final_norm, c.rms_norm_eps, sel);
  backend_.scale(sel, float(1.0 / c.logit_divisor()), sel);
  backend_.matmul(sel, weights_.lm_head, out);
  if (gkey) backend_.graph_capture_end(gkey);
  backend_.download(out, logits.data());
}

}  // namespace sala
