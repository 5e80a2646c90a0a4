#include "engine/replay.h"

#include <algorithm>

namespace sala {

std::vector<std::vector<float>> replay(Engine& engine, const std::vector<std::vector<int32_t>>& sequences,
                                       const ReplaySchedule& schedule) {
  std::vector<int> ids;
  for (size_t i = 0; i < sequences.size(); ++i) ids.push_back(engine.open());
  std::vector<std::vector<float>> logits(sequences.size());
  for (;;) {
    std::vector<Engine::Request> reqs;
    std::vector<size_t> owner;
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int64_t done = engine.length(ids[i]), n = int64_t(sequences[i].size());
      if (done == n) continue;
      const int64_t prompt = schedule.prefill < 0 ? n : std::min(schedule.prefill, n);
      int64_t take = 1, regime = -1;
      if (done < prompt) {
        take = std::min(schedule.chunk > 0 ? schedule.chunk : prompt, prompt - done);
        if (schedule.regime_by_prompt) regime = prompt;
      }
      reqs.push_back({ids[i], std::span(sequences[i]).subspan(size_t(done), size_t(take)), regime, true});
      owner.push_back(i);
    }
    if (reqs.empty()) break;
    auto out = engine.step(reqs);
    for (size_t r = 0; r < out.size(); ++r)
      logits[owner[r]].insert(logits[owner[r]].end(), out[r].begin(), out[r].end());
  }
  for (int id : ids) engine.close(id);
  return logits;
}

}  // namespace sala
