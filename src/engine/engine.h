// Sequences over the model's cache pools: a sequence is a lightning-state slot plus a list of KV
// pages (design notes, "Memory"). Admission, growth, snapshots and trimming are bookkeeping; the
// forward pass itself is one packed batch per step.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/step_logits.h"
#include "model/model.h"

namespace sala {

struct EngineOptions {
  int max_sequences = 4;          // live sequences at once
  int64_t max_context = 4096;     // tokens per sequence (prompt + generated)
};

class Engine {
 public:
  Engine(Model& model, EngineOptions options);
  Model& model() { return model_; }
  const EngineOptions& options() const { return options_; }

  int open();            // a new, empty sequence; throws when max_sequences are live
  void close(int seq);   // frees its slot and pages
  int64_t length(int seq) const;
  std::span<const int32_t> tokens(int seq) const;  // every token fed to the sequence so far

  struct Request {
    int seq;
    std::span<const int32_t> tokens;  // appended to the sequence in this step
    int64_t regime_len = -1;  // T used for the dense/sparse decision; -1: length after the step (§4.2)
    bool all_logits = false;  // logits for every token (else only the last)
    bool need_logits = true;  // false: no logits at all (a prompt chunk that does not end the prompt)
  };
  // One forward over all requests (a packed batch). Returns, per request, its logits rows
  // ([rows, vocab] flattened; empty when need_logits is false; step_logits.h). Total tokens must
  // fit the model's max_batch_tokens.
  // `n_layers` >= 0 runs only the first layers + final norm + lm_head (the self-draft, spec §6.1);
  // the caches of the layers it skips are not touched (roll the sequence back afterwards).
  StepLogits step(std::span<const Request> requests, int n_layers = -1);

  // Remembers the sequence's lightning states at its current length, so trim() can return to it.
  void snapshot(int seq);
  // Cuts the sequence back to new_len tokens: KV pages and compressed keys are bookkeeping; the
  // lightning states need a snapshot taken at exactly new_len (an error otherwise).
  void trim(int seq, int64_t new_len);

  // Speculative decoding with exact rollback (spec §6.2). begin_speculation snapshots the
  // lightning states at the current length L and turns on the model's lightning k/v capture;
  // rollback(seq, new_len) with L <= new_len <= length cuts the sequence back to new_len tokens:
  // KV pages and K1/K2 are bookkeeping (as in trim), the lightning states become the snapshot
  // advanced by the first new_len − L tokens of the LAST forward, which must have started at L
  // (the verify call) and run every layer; new_len == L needs no capture (after a draft pass).
  // The snapshot stays valid, so several rollbacks to lengths >= L may follow one another.
  void begin_speculation(int seq);
  void rollback(int seq, int64_t new_len);

 private:
  struct Sequence {
    int slot = -1;
    int snapshot_slot = -1;
    int64_t snapshot_len = -1;
    std::vector<int32_t> pages;
    std::vector<int32_t> tokens;
    bool speculating = false;
    // Where the last forward's captured lightning k/v of this sequence came from.
    uint64_t capture_step = 0;
    int64_t capture_start = -1, capture_row = 0, capture_n = 0;
    int capture_layers = 0;
  };
  void cut(Sequence& s, int64_t new_len);
  Sequence& get(int seq);
  const Sequence& get(int seq) const;
  int take_slot();
  void ensure_pages(Sequence& s, int64_t length);

  Model& model_;
  EngineOptions options_;
  int block_size_;
  std::vector<int32_t> free_pages_;
  std::vector<int> free_slots_;
  std::unordered_map<int, Sequence> seqs_;
  int next_id_ = 0;
  uint64_t steps_ = 0;
  // Logit buffers (step_logits.h): one is free when the pool holds its only reference.
  std::vector<std::shared_ptr<std::vector<float>>> logit_pool_;
  std::shared_ptr<std::vector<float>> logit_buffer(size_t floats);
};

// A sequence open for the life of a scope (closed on the way out, an exception included).
class ScopedSequence {
 public:
  explicit ScopedSequence(Engine& engine) : engine_(engine), id_(engine.open()) {}
  ~ScopedSequence() { engine_.close(id_); }
  ScopedSequence(const ScopedSequence&) = delete;
  ScopedSequence& operator=(const ScopedSequence&) = delete;
  int id() const { return id_; }

 private:
  Engine& engine_;
  int id_;
};

}  // namespace sala
