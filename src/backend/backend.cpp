#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace sala {

#ifdef SALA_HAS_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, bool batch_invariant);  // backend/cuda
bool cuda_device_available();
#endif

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"cpu"};
#ifdef SALA_HAS_CUDA
  if (cuda_device_available()) names.push_back("cuda");
#endif
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, bool batch_invariant) {
  if (name == "cpu") return std::make_unique<CpuBackend>(threads, batch_invariant);
  if (name == "cuda") {
#ifdef SALA_HAS_CUDA
    SALA_CHECK(cuda_device_available(), "backend 'cuda': no CUDA device is visible");
    return make_cuda_backend(0, batch_invariant);
#else
    fail("backend 'cuda' is not compiled into this build (configure with nvcc present, -DSALA_CUDA=ON)");
#endif
  }
  fail("unknown backend '{}' (known: cpu, cuda)", name);
}

}  // namespace sala
