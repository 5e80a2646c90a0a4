#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace sala {

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

  // Decode rows for every sequence with a pending token, then prompt chunks in arrival order.
  std::vector<Engine::Request> reqs;
  std::vector<size_t> owner;
  int64_t budget = options_.max_batch_tokens;
  bool has_prompt = false;
  for (size_t i = 0; i < active_.size(); ++i) {
    Active& a = active_[i];
    if (a.pending >= 0 && budget > 0) {
      reqs.push_back({a.seq, std::span(&a.pending, 1)});
      owner.push_back(i);
      --budget;
    }
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

  const auto t0 = std::chrono::steady_clock::now();
  auto logits = engine_.step(reqs);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
  (has_prompt ? stats_.prefill_seconds : stats_.decode_seconds) += dt;

  const auto& eos = engine_.model().config().eos_token_ids;
  const int64_t ctx = engine_.options().max_context;
  std::vector<size_t> done;
  for (size_t r = 0; r < reqs.size(); ++r) {
    Active& a = active_[owner[r]];
    if (a.pending >= 0) {
      a.pending = -1;
    } else {
      a.prefilled += int64_t(reqs[r].tokens.size());
      stats_.prompt_tokens += int64_t(reqs[r].tokens.size());
      if (!reqs[r].need_logits) continue;
    }
    SampledToken tok = a.sampler->sample(logits[r], engine_.tokens(a.seq));
    ++a.generated;
    ++stats_.generated_tokens;
    const bool is_eos = !a.req.ignore_eos && std::find(eos.begin(), eos.end(), tok.id) != eos.end();
    bool keep_going = true;
    // The EOS token itself is not reported as text; every other token is.
    if (!is_eos && a.req.on_token) keep_going = a.req.on_token(tok);
    if (is_eos || !keep_going) {
      finish(a, FinishReason::Stop);
      done.push_back(owner[r]);
    } else if (a.generated >= a.req.max_tokens || engine_.length(a.seq) + 1 >= ctx) {
      finish(a, FinishReason::Length);
      done.push_back(owner[r]);
    } else {
      a.pending = tok.id;
    }
  }
  std::sort(done.rbegin(), done.rend());
  for (size_t i : done) active_.erase(active_.begin() + std::ptrdiff_t(i));
  return true;
}

void Scheduler::run() {
  while (!idle()) step();
}

}  // namespace sala
