#include "engine/engine.h"

#include <algorithm>

#include "core/error.h"

namespace sala {

Engine::Engine(Model& model, EngineOptions options)
    : model_(model), options_(options), block_size_(model.config().sparse.block_size) {
  SALA_CHECK(options.max_sequences > 0, "engine: max_sequences must be positive");
  SALA_CHECK(options.max_context > 0, "engine: max_context must be positive");
  const int64_t pages_per_seq = (options.max_context + block_size_ - 1) / block_size_;
  const int64_t pages = pages_per_seq * options.max_sequences;
  SALA_CHECK(pages < (int64_t(1) << 31), "engine: {} cache pages is too many", pages);
  // Two slots per sequence: its live state and one snapshot.
  const int slots = 2 * options.max_sequences;
  model_.backend().create_caches(model_.cache_spec(int(pages), slots));
  for (int64_t p = pages - 1; p >= 0; --p) free_pages_.push_back(int32_t(p));
  for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

Engine::Sequence& Engine::get(int seq) {
  auto it = seqs_.find(seq);
  SALA_CHECK(it != seqs_.end(), "engine: no sequence {}", seq);
  return it->second;
}
const Engine::Sequence& Engine::get(int seq) const { return const_cast<Engine*>(this)->get(seq); }

int Engine::take_slot() {
  SALA_CHECK(!free_slots_.empty(), "engine: no free lightning-state slot");
  int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

int Engine::open() {
  SALA_CHECK(int(seqs_.size()) < options_.max_sequences, "engine: all {} sequence slots are in use",
             options_.max_sequences);
  Sequence s;
  s.slot = take_slot();
  model_.backend().reset_state(s.slot);
  const int id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

void Engine::close(int seq) {
  Sequence& s = get(seq);
  free_pages_.insert(free_pages_.end(), s.pages.begin(), s.pages.end());
  free_slots_.push_back(s.slot);
  if (s.snapshot_slot >= 0) free_slots_.push_back(s.snapshot_slot);
  seqs_.erase(seq);
}

int64_t Engine::length(int seq) const { return int64_t(get(seq).tokens.size()); }
std::span<const int32_t> Engine::tokens(int seq) const { return get(seq).tokens; }

void Engine::ensure_pages(Sequence& s, int64_t length) {
  const int64_t need = (length + block_size_ - 1) / block_size_;
  while (int64_t(s.pages.size()) < need) {
    SALA_CHECK(!free_pages_.empty(), "engine: KV cache pool exhausted ({} tokens per sequence x {} sequences)",
               options_.max_context, options_.max_sequences);
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
}

std::shared_ptr<std::vector<float>> Engine::logit_buffer(size_t floats) {
  for (auto& b : logit_pool_)
    if (b.use_count() == 1) {
      if (b->size() < floats) b->resize(floats);  // grows only (no zeroing per step)
      return b;
    }
  auto b = std::make_shared<std::vector<float>>(floats);
  // A caller keeping many steps' logits: no more than a few pooled buffers, the rest its own.
  if (logit_pool_.size() < 4) logit_pool_.push_back(b);
  return b;
}

StepLogits Engine::step(std::span<const Request> requests, int n_layers) {
  const int V = model_.config().vocab_size;
  BatchInfo batch;
  std::vector<int64_t> rows;
  std::vector<std::pair<size_t, size_t>> row_range;  // per request: first logits row, count
  for (const auto& r : requests) {
    Sequence& s = get(r.seq);
    const int64_t cached = int64_t(s.tokens.size()), n = int64_t(r.tokens.size());
    SALA_CHECK(n > 0, "engine: empty request for sequence {}", r.seq);
    SALA_CHECK(cached + n <= options_.max_context, "engine: sequence {} would reach {} tokens, context is {}", r.seq,
               cached + n, options_.max_context);
    ensure_pages(s, cached + n);
    SeqEntry e;
    e.slot = s.slot;
    e.start = batch.n_tokens();
    e.n_new = n;
    e.cached = cached;
    const int64_t regime_len = r.regime_len >= 0 ? r.regime_len : cached + n;
    e.sparse = regime_len >= model_.config().sparse.dense_len;
    e.pages = s.pages;
    for (int64_t i = 0; i < n; ++i) {
      batch.tokens.push_back(r.tokens[size_t(i)]);
      batch.positions.push_back(int32_t(cached + i));
    }
    const size_t first = rows.size();
    if (r.need_logits)
      for (int64_t i = r.all_logits ? 0 : n - 1; i < n; ++i) rows.push_back(e.start + i);
    row_range.emplace_back(first, rows.size() - first);
    batch.seqs.push_back(std::move(e));
  }
  const size_t floats = rows.size() * size_t(V);
  std::shared_ptr<std::vector<float>> buffer = logit_buffer(floats);
  model_.forward(batch, rows, std::span(buffer->data(), floats), n_layers);
  ++steps_;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    Sequence& s = get(r.seq);
    if (s.speculating && model_.capturing()) {
      const SeqEntry& e = batch.seqs[i];
      s.capture_step = steps_;
      s.capture_start = e.cached;
      s.capture_row = e.start;
      s.capture_n = std::clamp<int64_t>(model_.captured_rows() - e.start, 0, e.n_new);
      s.capture_layers = model_.captured_layers();
    }
    s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
  }
  for (auto& [first, count] : row_range) first *= size_t(V), count *= size_t(V);
  return StepLogits(std::move(buffer), std::move(row_range));
}

void Engine::snapshot(int seq) {
  Sequence& s = get(seq);
  if (s.snapshot_slot < 0) s.snapshot_slot = take_slot();
  model_.backend().copy_state(s.slot, s.snapshot_slot);
  s.snapshot_len = int64_t(s.tokens.size());
}

void Engine::trim(int seq, int64_t new_len) {
  Sequence& s = get(seq);
  SALA_CHECK(new_len >= 0 && new_len <= int64_t(s.tokens.size()), "engine: cannot trim sequence {} of {} tokens to {}",
             seq, s.tokens.size(), new_len);
  if (new_len == int64_t(s.tokens.size())) return;
  SALA_CHECK(s.snapshot_len == new_len,
             "engine: cannot trim sequence {} to {} tokens: lightning states are only restorable to a snapshot "
             "(taken at {})", seq, new_len, s.snapshot_len);
  model_.backend().copy_state(s.snapshot_slot, s.slot);
  cut(s, new_len);
}

void Engine::cut(Sequence& s, int64_t new_len) {
  s.tokens.resize(size_t(new_len));
  // Pages past the new length go back to the pool; K1/K2 beyond n1/n2(new_len) are simply
  // overwritten when the sequence grows again.
  const int64_t keep = (new_len + block_size_ - 1) / block_size_;
  while (int64_t(s.pages.size()) > keep) {
    free_pages_.push_back(s.pages.back());
    s.pages.pop_back();
  }
}

void Engine::begin_speculation(int seq) {
  snapshot(seq);
  Sequence& s = get(seq);
  s.speculating = true;
  s.capture_step = 0;
  if (!model_.capturing()) model_.capture_lightning_kv(true, 64);
}

void Engine::rollback(int seq, int64_t new_len) {
  Sequence& s = get(seq);
  const int64_t len = int64_t(s.tokens.size());
  SALA_CHECK(s.speculating && s.snapshot_len >= 0, "engine: rollback of sequence {} without begin_speculation", seq);
  SALA_CHECK(new_len >= s.snapshot_len && new_len <= len,
             "engine: cannot roll sequence {} back to {} tokens (snapshot at {}, length {})", seq, new_len,
             s.snapshot_len, len);
  if (new_len == len) return;
  const int64_t keep = new_len - s.snapshot_len;
  Backend& be = model_.backend();
  if (keep == 0) {
    be.copy_state(s.snapshot_slot, s.slot);
  } else {
    const int nl = model_.config().count(MixerKind::Lightning);
    SALA_CHECK(s.capture_step == steps_ && s.capture_start == s.snapshot_len && s.capture_n >= keep &&
                   s.capture_layers == nl,
               "engine: cannot roll sequence {} back to {} tokens: the last forward did not capture tokens [{}, {}) "
               "of every lightning layer", seq, new_len, s.snapshot_len, new_len);
    for (int l = 0; l < nl; ++l)
      be.lightning_rollback(l, s.slot, s.snapshot_slot, model_.captured_k(l).slice_rows(s.capture_row, keep),
                            model_.captured_v(l).slice_rows(s.capture_row, keep), keep);
  }
  cut(s, new_len);
}

}  // namespace sala
