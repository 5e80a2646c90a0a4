#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace sala {

#ifdef SALA_HAS_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, bool batch_invariant);  // backend/cuda
bool cuda_device_available();
#endif

void Backend::lightning_block(int layer, Mat q, Mat k, const Mat& v, const LightningNorms& n, Mat out) {
  lightning_qk(q, k, n);
  lightning_attention(layer, q, k, v, out);
  lightning_output(n, out);
}

void Backend::lightning_qk(Mat q, Mat k, const LightningNorms& n) {
  SALA_CHECK(!n.q_norm == !n.k_norm, "lightning_block: q_norm and k_norm come together");
  if (n.q_norm) {
    qk_norm_rope(q, k, *n.q_norm, *n.k_norm, n.eps, n.head_dim, n.rope, n.theta);
  } else if (n.rope) {
    rope(q, n.head_dim, n.theta);
    rope(k, n.head_dim, n.theta);
  }
}

void Backend::lightning_output(const LightningNorms& n, Mat out) {
  if (n.o_norm && n.z)
    rmsnorm_gate(out, *n.o_norm, n.eps, *n.z, out);
  else if (n.o_norm)
    rmsnorm(out, *n.o_norm, n.eps, out);
  else if (n.z)
    sigmoid_mul(out, *n.z, out);
}

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
