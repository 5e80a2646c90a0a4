// Replays token sequences through an engine with a fixed schedule — prompt chunks, then one token
// per step, all sequences advancing in the same packed steps — and collects the logits of every
// position. Used by `sala logits` and the golden tests, so both run exactly the same schedule.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace sala {

struct ReplaySchedule {
  int64_t prefill = -1;        // prompt tokens per sequence (min with its length); -1: all
  int64_t chunk = 0;           // prompt chunk size; 0: whole prompt in one call
  bool regime_by_prompt = true;  // prompt chunks decide dense/sparse by the whole prompt (§4.2)
};

// Returns, per sequence, logits [len, vocab] flattened. The engine needs one free sequence per
// input and a workspace for chunk * sequences tokens.
std::vector<std::vector<float>> replay(Engine& engine, const std::vector<std::vector<int32_t>>& sequences,
                                       const ReplaySchedule& schedule);

}  // namespace sala
