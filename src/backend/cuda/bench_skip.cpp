// SALA_CUDA_BENCH_SKIP: a timing experiment, not a mode — the one-row decode launches it names are
// not made, so every output after them is wrong. What a batch-1 step costs without its small
// kernels (bench/results/2026-11-27-h100-step-decomposition.md): bits 1 add_rmsnorm, 2 the
// lightning output norm and gate, 4 the GLA recurrence, 8 the sparse layers' K/V append,
// attention and combine.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/kernels.h"

namespace sala::cuda {

bool bench_skips(int kernels, int64_t rows) {
  static const int mask = [] {
    const char* e = std::getenv("SALA_CUDA_BENCH_SKIP");
    const int m = e && *e ? std::atoi(e) : 0;
    if (m)
      std::fprintf(stderr,
                   "warning: SALA_CUDA_BENCH_SKIP=%d: one-row decode launches are skipped, outputs are wrong "
                   "(timing experiments only)\n",
                   m);
    return m;
  }();
  return rows == 1 && (mask & kernels) != 0;
}

}  // namespace sala::cuda
