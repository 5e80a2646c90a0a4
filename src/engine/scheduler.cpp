#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace sala {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

Scheduler::Scheduler(Engine& engine, SchedulerOptions options) : engine_(engine), options_(options) {
  SALA_CHECK(options.prefill_chunk > 0 && options.max_batch_tokens > 0, "scheduler: chunk sizes must be positive");
  SALA_CHECK(options.max_batch_tokens <= engine.model().limits().max_batch_tokens,
             "scheduler: max_batch_tokens {} exceeds the model workspace ({})", options.max_batch_tokens,
             engine.model().limits().max_batch_tokens);
  SALA_CHECK(engine.options().max_sequences <= engine.model().limits().max_logit_rows,
             "scheduler: {} sequences need that many logit rows (workspace has {})", engine.options().max_sequences,
             engine.model().limits().max_logit_rows);
  SpeculativeOptions& spec = options_.speculative;
  if (spec.mode == SpeculativeMode::Off) return;
  spec.validate();
  Model& model = engine.model();
  // Room for one full verify (K + 1 rows) next to one row for every other sequence.
  const int64_t need = engine.options().max_sequences + spec.draft_tokens;
  SALA_CHECK(model.limits().max_logit_rows >= need,
             "scheduler: speculation with {} sequences and --draft-tokens {} needs {} logit rows (workspace has {})",
             engine.options().max_sequences, spec.draft_tokens, need, model.limits().max_logit_rows);
  SALA_CHECK(options.max_batch_tokens >= need,
             "scheduler: speculation with {} sequences and --draft-tokens {} needs max_batch_tokens >= {}, got {}",
             engine.options().max_sequences, spec.draft_tokens, need, options.max_batch_tokens);
  spec.draft_layers = std::min(spec.draft_layers, model.config().num_layers);
  if (spec.mode == SpeculativeMode::Self) drafter_ = std::make_unique<SelfDrafter>(spec.draft_layers);
  else drafter_ = std::make_unique<LookupDrafter>();
  // Verify rows come first in the packed batch and never exceed the step's logit rows.
  capture_rows_ = std::min(model.limits().max_logit_rows, options.max_batch_tokens);
  // The capture buffer is allocated now (Engine::begin_speculation asks for 64 rows), so no step
  // allocates; capture is on only for forwards that verify (plain steps stay graph-replayable).
  model.capture_lightning_kv(true, std::max<int64_t>(capture_rows_, 64));
  model.capture_lightning_kv(false);
}

int Scheduler::submit(GenerationRequest request) {
  const int64_t ctx = engine_.options().max_context;
  SALA_CHECK(!request.prompt.empty(), "empty prompt");
  SALA_CHECK(int64_t(request.prompt.size()) < ctx, "prompt of {} tokens does not fit the context of {} tokens",
             request.prompt.size(), ctx);
  const int vocab = engine_.model().config().vocab_size;
  for (int32_t t : request.prompt) SALA_CHECK(t >= 0 && t < vocab, "prompt token {} outside the vocabulary", t);
  SALA_CHECK(request.max_tokens >= 0, "max_tokens must be >= 0, got {}", request.max_tokens);
  Active a;
  a.id = next_id_++;
  a.sampler.emplace(request.sampling);  // validates the sampling parameters now, not mid-run
  a.req = std::move(request);
  waiting_.push_back(std::move(a));
  return waiting_.back().id;
}

void Scheduler::cancel(int id) { cancel_requests_.push_back(id); }

void Scheduler::finish(Active& a, FinishReason why) {
  if (a.seq >= 0 && drafter_) drafter_->forget(a.seq);
  if (a.seq >= 0) engine_.close(a.seq);
  a.seq = -1;
  if (a.req.on_finish) a.req.on_finish(why);
}

bool Scheduler::step() {
  // Cancellations first: their caches are freed before anything else is admitted.
  for (int id : cancel_requests_) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
      if (it->id == id) {
        finish(*it, FinishReason::Cancelled);
        waiting_.erase(it);
        break;
      }
    for (auto& a : active_)
      if (a.id == id) a.cancelled = true;
  }
  cancel_requests_.clear();
  std::erase_if(active_, [&](Active& a) {
    if (!a.cancelled) return false;
    finish(a, FinishReason::Cancelled);
    return true;
  });
  // Requests that ask for nothing finish at once, wherever they are in the queue.
  std::erase_if(waiting_, [&](Active& a) {
    if (a.req.max_tokens != 0) return false;
    finish(a, FinishReason::Length);
    return true;
  });
  // Admission: as many waiting requests as there are free sequences.
  while (!waiting_.empty() && int(active_.size()) < engine_.options().max_sequences) {
    Active a = std::move(waiting_.front());
    waiting_.pop_front();
    a.seq = engine_.open();
    active_.push_back(std::move(a));
  }
  if (active_.empty()) return false;

  // Speculation first: drafts for the decoding sequences, from the logit rows and batch tokens
  // that the plain step leaves over (one row per sequence, one token per decode row).
  const auto t0 = Clock::now();
  std::vector<size_t> decoding;
  for (size_t i = 0; i < active_.size(); ++i)
    if (active_[i].pending >= 0) decoding.push_back(i);
  int64_t budget = options_.max_batch_tokens;
  if (drafter_ && !decoding.empty()) {
    draft(decoding, engine_.model().limits().max_logit_rows - int64_t(active_.size()),
          budget - int64_t(decoding.size()));
  }

  // Verify rows first (the model captures lightning k/v of the first packed rows only), then
  // plain decode rows, then prompt chunks in arrival order.
  std::vector<Engine::Request> reqs;
  std::vector<size_t> owner;
  bool has_prompt = false, has_verify = false;
  for (size_t i : decoding) {
    Active& a = active_[i];
    if (a.verify.empty()) continue;
    reqs.push_back({a.seq, a.verify, -1, true});
    owner.push_back(i);
    budget -= int64_t(a.verify.size());
    has_verify = true;
  }
  for (size_t i : decoding) {
    Active& a = active_[i];
    if (!a.verify.empty() || budget <= 0) continue;
    reqs.push_back({a.seq, std::span(&a.pending, 1)});
    owner.push_back(i);
    --budget;
  }
  for (size_t i = 0; i < active_.size() && budget > 0; ++i) {
    Active& a = active_[i];
    const int64_t plen = int64_t(a.req.prompt.size());
    if (a.pending >= 0 || a.prefilled >= plen) continue;
    const int64_t take = std::min({options_.prefill_chunk, plen - a.prefilled, budget});
    const bool last = a.prefilled + take == plen;
    // Every chunk of a prompt takes the regime of the whole prompt (spec §4.2).
    reqs.push_back({a.seq, std::span(a.req.prompt).subspan(size_t(a.prefilled), size_t(take)), plen, false, last});
    owner.push_back(i);
    budget -= take;
    has_prompt = true;
  }
  if (reqs.empty()) return false;

  if (drafter_) engine_.model().capture_lightning_kv(has_verify, capture_rows_);
  const auto tf = Clock::now();
  auto logits = engine_.step(reqs);
  if (has_verify) stats_.speculative.verify_seconds += since(tf);
  ++stats_.steps;
  (has_prompt ? stats_.prefill_seconds : stats_.decode_seconds) += since(t0);

  SpeculativeStats& sp = stats_.speculative;
  std::vector<size_t> done;
  for (size_t r = 0; r < reqs.size(); ++r) {
    Active& a = active_[owner[r]];
    if (!a.verify.empty()) {
      const auto drafts = std::span<const int32_t>(a.verify).subspan(1);
      const int64_t C = engine_.length(a.seq) - int64_t(a.verify.size());  // length before x0
      const Verdict v = accept_drafts(*a.sampler, logits[r], drafts, engine_.tokens(a.seq));
      ++sp.rounds;
      sp.drafted += int64_t(drafts.size());
      sp.accepted += v.accepted;
      if (v.accepted == int(drafts.size())) ++sp.all_accepted;
      else if (v.accepted > 0) ++sp.partly_accepted;
      if (options_.speculative.adaptive)
        a.draft_k = adapt_draft_tokens(a.draft_k, int(drafts.size()), v.accepted, options_.speculative.draft_tokens);
      a.verify.clear();
      a.pending = -1;
      bool alive = true;
      for (size_t i = 0; i < v.tokens.size() && alive; ++i, ++sp.emitted)
        alive = deliver(a, v.tokens[i], C + 1 + int64_t(i));
      if (!alive) {
        done.push_back(owner[r]);
        continue;
      }
      engine_.rollback(a.seq, C + v.accepted + 1);  // keep x0, d1..da; the last token is the next x0
      a.pending = v.tokens.back().id;
      continue;
    }
    if (a.pending >= 0) {
      a.pending = -1;
    } else {
      a.prefilled += int64_t(reqs[r].tokens.size());
      stats_.prompt_tokens += int64_t(reqs[r].tokens.size());
      if (!reqs[r].need_logits) continue;
    }
    SampledToken tok = a.sampler->sample(logits[r], engine_.tokens(a.seq));
    if (deliver(a, tok, engine_.length(a.seq))) a.pending = tok.id;
    else done.push_back(owner[r]);
  }
  // Off between steps (the rollbacks above read the capture), so that nothing else driving the
  // model pays for it.
  if (has_verify) engine_.model().capture_lightning_kv(false);
  std::sort(done.rbegin(), done.rend());
  for (size_t i : done) active_.erase(active_.begin() + std::ptrdiff_t(i));
  return true;
}

bool Scheduler::deliver(Active& a, const SampledToken& tok, int64_t fed) {
  ++a.generated;
  ++stats_.generated_tokens;
  const auto& eos = engine_.model().config().eos_token_ids;
  const bool is_eos = !a.req.ignore_eos && std::find(eos.begin(), eos.end(), tok.id) != eos.end();
  bool keep_going = true;
  // The EOS token itself is not reported as text; every other token is.
  if (!is_eos && a.req.on_token) keep_going = a.req.on_token(tok);
  if (is_eos || !keep_going) {
    finish(a, FinishReason::Stop);
    return false;
  }
  if (a.generated >= a.req.max_tokens || fed + 1 >= engine_.options().max_context) {
    finish(a, FinishReason::Length);
    return false;
  }
  return true;
}

void Scheduler::draft(const std::vector<size_t>& decoding, int64_t rows_left, int64_t tokens_left) {
  const auto t0 = Clock::now();
  SpeculativeStats& sp = stats_.speculative;
  const int64_t ctx = engine_.options().max_context;
  const int64_t dense_len = engine_.model().config().sparse.dense_len;
  std::vector<DraftJob> jobs;
  std::vector<size_t> owner;
  for (size_t i : decoding) {
    Active& a = active_[i];
    DraftSkip why = DraftSkip::Budget;
    const SpeculativeOptions& so = options_.speculative;
    if (so.adaptive && a.draft_k <= 0) a.draft_k = std::min(kAdaptiveStartTokens, so.draft_tokens);
    int k = max_draft_tokens(engine_.length(a.seq), ctx, a.req.max_tokens - a.generated, dense_len,
                             so.adaptive ? a.draft_k : so.draft_tokens, &why);
    if (k > 0) {
      k = int(std::min<int64_t>({k, rows_left, tokens_left}));
      if (k <= 0) why = DraftSkip::Budget;
    }
    if (k <= 0) {
      ++sp.skipped[size_t(why)];
      continue;
    }
    rows_left -= k;
    tokens_left -= k;
    jobs.push_back({.seq = a.seq, .x0 = a.pending, .k = k, .drafts = {}});
    owner.push_back(i);
  }
  if (jobs.empty()) return;
  if (drafter_->runs_forwards())
    for (const DraftJob& j : jobs) engine_.begin_speculation(j.seq);
  engine_.model().capture_lightning_kv(false);  // draft forwards need no k/v capture
  drafter_->propose(engine_, jobs);
  for (size_t q = 0; q < jobs.size(); ++q) {
    const DraftJob& j = jobs[q];
    SALA_CHECK(int64_t(j.drafts.size()) <= j.k, "drafter proposed {} tokens for sequence {}, at most {} were asked",
               j.drafts.size(), j.seq, j.k);
    if (j.drafts.empty()) {
      ++sp.skipped[size_t(DraftSkip::NoMatch)];
      continue;
    }
    if (!drafter_->runs_forwards()) engine_.begin_speculation(j.seq);
    Active& a = active_[owner[q]];
    a.verify.assign(1, j.x0);
    a.verify.insert(a.verify.end(), j.drafts.begin(), j.drafts.end());
  }
  sp.draft_seconds += since(t0);
}

void Scheduler::run() {
  while (!idle()) step();
}

}  // namespace sala
