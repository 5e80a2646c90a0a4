// How far one model's logits are from a reference's over the same positions: what the quality
// tables of the packed formats report (docs/quantization.md, `sala quant-quality`, the quant tests).
#pragma once
#include <span>

namespace sala {

struct LogitStats {
  double rel = 0;   // ‖got − ref‖₂ / ‖ref‖₂ over all positions and words
  double top1 = 0;  // fraction of positions whose argmax agrees
  double kl = 0;    // mean over positions of KL(softmax(ref) ‖ softmax(got)), nats
  double max_kl = 0;
  long positions = 0;
};

class ThreadPool;

// ref and got: [positions, vocab] row-major, the same size (checked). With a pool, positions in
// parallel (the same result: per-position terms are summed in order afterwards).
LogitStats compare_logits(std::span<const float> ref, std::span<const float> got, int vocab,
                          ThreadPool* pool = nullptr);

}  // namespace sala
