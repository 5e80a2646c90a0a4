// Where a decode step's device time goes, from a trace of its kernels (start and end of each
// launch on the GPU clock; `sala bench --kernel-trace`, CUDA: backend/cuda/kernel_trace.h).
//
// Under programmatic dependent launch the kernels of one stream overlap: a kernel starts (its
// first CTA, loading weights before its dependency wait) while the one before it drains. So a
// kernel's own span says little about the step; what it costs the step is how far it pushes the
// step's completion frontier: exposed = max(0, end − the latest end of the kernels before it).
// The exposed times of a step's kernels add up to its device span (first start to last end);
// summed per kernel family over the steps, they say which kernels the step waits on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sala {

struct KernelSpan {
  std::string name;  // the kernel's (demangled) name
  uint64_t start = 0, end = 0;  // ns, one clock for every span and step mark
  int grid = 0;  // CTAs (x·y·z): tells apart launches of one kernel with different shapes
};

struct KernelFamilyTime {
  std::string family;     // short name [CTAs]
  double launches = 0;    // per step
  double span_us = 0;     // mean end − start of one launch
  double exposed_us = 0;  // per step, summed over its launches
};

struct KernelTimeline {
  int steps = 0;
  double device_us = 0;   // per step: first kernel start to last kernel end (= Σ exposed)
  double host_gap_us = 0;  // per step: from the step's mark to its first kernel start
  std::vector<KernelFamilyTime> families;  // by exposed time, largest first
};

// The kernel's name without namespaces, template arguments or parameters ("qgemv_kernel").
std::string kernel_short_name(const std::string& name);

// Spans grouped by step: step i holds the spans starting in [marks[i], marks[i + 1]) (the last one
// to its end); spans before marks[0] are ignored. Steps without kernels are not counted.
KernelTimeline kernel_timeline(std::vector<KernelSpan> spans, const std::vector<uint64_t>& marks);

// Every launch of the traced steps as CSV lines under kKernelSpansCsvHeader (row: the caller's
// label, e.g. the bench row; step; index in the step; kernel; CTAs; start, end and exposed µs from
// the step's first kernel start): `sala bench --kernel-trace-csv`, to read a step launch by launch.
inline constexpr const char* kKernelSpansCsvHeader = "row,step,index,kernel,ctas,start_us,end_us,exposed_us\n";
std::string kernel_spans_csv(std::vector<KernelSpan> spans, const std::vector<uint64_t>& marks, int row);

// The timeline as a fixed-width table (the families taking `min_share` of the device time or more,
// the rest summed in one line).
std::string format_kernel_timeline(const KernelTimeline& t, double min_share = 0.005);

}  // namespace sala
