// The machine's ceilings for `sala bench`'s roofline columns, measured through the backend's own
// ops in the same run as the rows they stand beside (never a datasheet figure).
#pragma once

#include "backend/backend.h"

namespace sala::cli {

struct Ceilings {
  double bandwidth = 0;  // bytes/s, read + write of a large elementwise op
  double matmul = 0;     // FLOP/s of a large square matmul in the backend's activation dtype
};

// big: GPU-sized buffers (512 MiB bf16, an 8192³ matmul), else a CPU-sized run (2048 × 8192, 1024³).
// Medians of several timed runs after a warm-up.
double measure_bandwidth(Backend& b, bool big);
double measure_matmul(Backend& b, bool big);
inline Ceilings measure_ceilings(Backend& b, bool big) { return {measure_bandwidth(b, big), measure_matmul(b, big)}; }

}  // namespace sala::cli
