#include "backend/cuda/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace sala::cuda {

namespace {

// The CUPTI entry points a trace uses, from libcupti loaded at run time.
struct Cupti {
  void* lib = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

const Cupti& cupti() {
  static const Cupti c = [] {
    Cupti r;
    std::string tried;
    for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12", "/usr/local/cuda/lib64/libcupti.so",
                             "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"}) {
      r.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (r.lib) break;
      tried += tried.empty() ? name : std::string(", ") + name;
    }
    SALA_CHECK(r.lib, "kernel trace: CUPTI (libcupti, part of the CUDA toolkit) not found (tried {}); add its "
                      "directory to LD_LIBRARY_PATH",
               tried);
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(r.lib, name));
      SALA_CHECK(fn, "kernel trace: libcupti lacks {}", name);
    };
    sym(r.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(r.enable, "cuptiActivityEnable");
    sym(r.disable, "cuptiActivityDisable");
    sym(r.flush_all, "cuptiActivityFlushAll");
    sym(r.next_record, "cuptiActivityGetNextRecord");
    sym(r.timestamp, "cuptiGetTimestamp");
    sym(r.result_string, "cuptiGetResultString");
    return r;
  }();
  return c;
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = "?";
  cupti().result_string(r, &s);
  fail("kernel trace: {} failed: {}", what, s);
}

// CUPTI hands completed buffers to a C callback: the spans gather here (one trace at a time).
std::mutex g_mutex;
std::vector<KernelSpan> g_spans;
std::atomic<bool> g_active{false};

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<KernelSpan> got;
  while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    got.push_back({demangle(k->name), k->start, k->end, k->gridX * k->gridY * k->gridZ});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.insert(g_spans.end(), got.begin(), got.end());
}

}  // namespace

KernelTrace::KernelTrace() {
  const Cupti& c = cupti();
  SALA_CHECK(!g_active.exchange(true), "kernel trace: one trace at a time");
  try {
    check(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  } catch (...) {
    g_active = false;
    throw;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.clear();
}

KernelTrace::~KernelTrace() {
  const Cupti& c = cupti();
  c.flush_all(0);
  c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  g_active = false;
}

uint64_t KernelTrace::now() const {
  uint64_t t = 0;
  check(cupti().timestamp(&t), "cuptiGetTimestamp");
  return t;
}

std::vector<KernelSpan> KernelTrace::take() {
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(g_spans, {});
}

}  // namespace sala::cuda
