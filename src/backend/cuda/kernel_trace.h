// The GPU's kernel launches with their start and end times, through CUPTI's activity API
// (`sala bench --kernel-trace`; analysis: engine/kernel_timeline.h). libcupti ships with the CUDA
// toolkit rather than with the driver, so it is loaded when a trace starts, not linked: a machine
// without it runs everything else and says so here.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kernel_timeline.h"

namespace sala::cuda {

class KernelTrace {
 public:
  // Starts recording every kernel of every stream (concurrent-kernel records: the kernels are not
  // serialised). Throws sala::Error naming the library or the CUPTI call that failed; one trace at
  // a time per process.
  KernelTrace();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Now on the clock of the spans (ns): a host-side mark, e.g. where a step begins.
  uint64_t now() const;
  // The spans recorded since the last take (the device work must be finished: synchronise first).
  std::vector<KernelSpan> take();
};

}  // namespace sala::cuda
