#include "engine/kernel_timeline.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace sala {

std::string kernel_short_name(const std::string& name) {
  // Cut at the template arguments or the parameter list, then drop the namespaces and a leading
  // return type ("void sala::cuda::(anonymous namespace)::k<...>(...)" → "k").
  static const std::string anon = "(anonymous namespace)";  // a scope, not a parameter list
  std::string s;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, anon.size(), anon) == 0) {
      s += anon;
      i += anon.size() - 1;
      continue;
    }
    if (name[i] == '<' || name[i] == '(') break;
    s += name[i];
  }
  const size_t colon = s.rfind("::");
  if (colon != std::string::npos) s = s.substr(colon + 2);
  const size_t space = s.rfind(' ');
  if (space != std::string::npos) s = s.substr(space + 1);
  return s.empty() ? name : s;
}

namespace {

// Walks the steps' launches in start order: visit(step, index in step, span, step's first start,
// exposed ns); returns per step {first start, mark, completion frontier}.
struct StepBounds {
  uint64_t first = 0, mark = 0, frontier = 0;
};
template <typename Visit>
std::vector<StepBounds> walk_steps(std::vector<KernelSpan>& spans, const std::vector<uint64_t>& marks, Visit visit) {
  std::vector<StepBounds> steps;
  if (marks.empty()) return steps;
  std::sort(spans.begin(), spans.end(), [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
  size_t i = 0;
  while (i < spans.size() && spans[i].start < marks[0]) ++i;
  for (size_t m = 0; m < marks.size(); ++m) {
    const uint64_t until = m + 1 < marks.size() ? marks[m + 1] : UINT64_MAX;
    if (i >= spans.size() || spans[i].start >= until) continue;
    StepBounds b{spans[i].start, marks[m], spans[i].start};
    for (int index = 0; i < spans.size() && spans[i].start < until; ++i, ++index) {
      const KernelSpan& k = spans[i];
      const uint64_t exposed = k.end > b.frontier ? k.end - b.frontier : 0;
      b.frontier = std::max(b.frontier, k.end);
      visit(int(steps.size()), index, k, b.first, exposed);
    }
    steps.push_back(b);
  }
  return steps;
}

}  // namespace

std::string kernel_spans_csv(std::vector<KernelSpan> spans, const std::vector<uint64_t>& marks, int row) {
  std::string out;
  walk_steps(spans, marks, [&](int step, int index, const KernelSpan& k, uint64_t first, uint64_t exposed) {
    out += fmt::format("{},{},{},{},{},{:.3f},{:.3f},{:.3f}\n", row, step, index, kernel_short_name(k.name), k.grid,
                       double(k.start - first) / 1e3, double(k.end - first) / 1e3, double(exposed) / 1e3);
  });
  return out;
}

KernelTimeline kernel_timeline(std::vector<KernelSpan> spans, const std::vector<uint64_t>& marks) {
  KernelTimeline t;
  struct Acc {
    double launches = 0, span_ns = 0, exposed_ns = 0;
  };
  std::map<std::string, Acc> acc;
  const auto bounds = walk_steps(spans, marks, [&](int, int, const KernelSpan& k, uint64_t, uint64_t exposed) {
    Acc& a = acc[fmt::format("{} [{}]", kernel_short_name(k.name), k.grid)];
    a.launches += 1;
    a.span_ns += double(k.end - k.start);
    a.exposed_ns += double(exposed);
  });
  double device_ns = 0, gap_ns = 0;
  for (const StepBounds& b : bounds) {
    device_ns += double(b.frontier - b.first);
    gap_ns += double(b.first - b.mark);
  }
  t.steps = int(bounds.size());
  if (t.steps == 0) return t;
  const double steps = t.steps;
  t.device_us = device_ns / steps / 1e3;
  t.host_gap_us = gap_ns / steps / 1e3;
  for (const auto& [family, a] : acc)
    t.families.push_back({family, a.launches / steps, a.span_ns / a.launches / 1e3, a.exposed_ns / steps / 1e3});
  std::sort(t.families.begin(), t.families.end(),
            [](const KernelFamilyTime& a, const KernelFamilyTime& b) { return a.exposed_us > b.exposed_us; });
  return t;
}

std::string format_kernel_timeline(const KernelTimeline& t, double min_share) {
  std::string out = fmt::format("kernel timeline: {} steps, device {:.1f} us/step (first kernel start to last end), "
                                "host gap {:.1f} us/step\n",
                                t.steps, t.device_us, t.host_gap_us);
  out += fmt::format("  {:<44} {:>9} {:>10} {:>13} {:>7}\n", "kernel [CTAs]", "per step", "span us", "exposed us", "share");
  double rest = 0, rest_launches = 0;
  for (const KernelFamilyTime& f : t.families) {
    const double share = t.device_us > 0 ? f.exposed_us / t.device_us : 0;
    if (share < min_share) {
      rest += f.exposed_us, rest_launches += f.launches;
      continue;
    }
    out += fmt::format("  {:<44} {:>9.1f} {:>10.2f} {:>13.1f} {:>6.1f}%\n", f.family.substr(0, 44), f.launches,
                       f.span_us, f.exposed_us, 100 * share);
  }
  if (rest_launches > 0)
    out += fmt::format("  {:<44} {:>9.1f} {:>10} {:>13.1f} {:>6.1f}%\n", "(the rest)", rest_launches, "",
                       rest, t.device_us > 0 ? 100 * rest / t.device_us : 0);
  return out;
}

}  // namespace sala
