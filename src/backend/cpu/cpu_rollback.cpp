// Exact rollback of lightning states for speculative decoding (spec §6.2): the state after the
// first `keep` tokens of a multi-token call, rebuilt from the snapshot taken before the call and
// the k/v rows the model captured during it — the §3.7 chunk update with C' = keep:
//   S = exp(keep·g) · S_snap + Σ_{j<keep} exp((keep−1−j)·g) · k_j ⊗ v_j
// per head, fp32, exponentials from the fp32 log-decay (never powers of a rounded γ).
// Cost: keep·d² MAC per head — the same as feeding the kept tokens once more, without q.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace sala {

// The default of the Backend interface (kept out of backend.h so that header stays free of fmt).
void Backend::lightning_rollback(int, int, int, const Mat&, const Mat&, int64_t) {
  fail("lightning_rollback is not implemented on backend {}", name());
}

void CpuBackend::lightning_rollback(int layer, int slot, int snapshot_slot, const Mat& k, const Mat& v,
                                    int64_t keep) {
  SALA_CHECK(layer >= 0 && layer < spec_.lightning_layers, "cpu lightning_rollback: layer {} out of range [0, {})",
             layer, spec_.lightning_layers);
  SALA_CHECK(slot >= 0 && slot < spec_.max_slots && snapshot_slot >= 0 && snapshot_slot < spec_.max_slots,
             "cpu lightning_rollback: slots {} <- {} out of range", slot, snapshot_slot);
  SALA_CHECK(keep >= 0, "cpu lightning_rollback: keep {} is negative", keep);
  const int d = spec_.lightning_dim, H = spec_.lightning_heads;
  const size_t hd2 = size_t(d) * d;
  float* S = state(slot, layer);
  const float* S0 = state(snapshot_slot, layer);
  if (keep == 0) {
    if (S != S0) std::copy_n(S0, size_t(H) * hd2, S);
    return;
  }
  SALA_CHECK(k.dtype == DType::F32 && v.dtype == DType::F32, "cpu lightning_rollback: k/v must be f32");
  SALA_CHECK(k.rows >= keep && v.rows >= keep && k.cols == v.cols && k.cols % d == 0 && k.cols > 0,
             "cpu lightning_rollback: k/v [{}, {}] / [{}, {}] for keep {} and head dim {}", k.rows, k.cols, v.rows,
             v.cols, keep, d);
  const int Hkv = int(k.cols / d);
  SALA_CHECK(H % Hkv == 0, "cpu lightning_rollback: {} heads not a multiple of {} kv heads", H, Hkv);
  const int rep = H / Hkv;
  const float* K = static_cast<const float*>(k.data);
  const float* V = static_cast<const float*>(v.data);
  pool_.parallel_for(H, [&](int64_t h0, int64_t h1) {
    std::vector<float> w(static_cast<size_t>(keep));
    for (int64_t h = h0; h < h1; ++h) {
      const double g = double(spec_.log_decay[size_t(h)]);
      const float decay = float(std::exp(double(keep) * g));
      for (int64_t j = 0; j < keep; ++j) w[size_t(j)] = float(std::exp(double(keep - 1 - j) * g));
      float* Sh = S + size_t(h) * hd2;
      const float* S0h = S0 + size_t(h) * hd2;
      const int kh = int(h) / rep;
      for (int a = 0; a < d; ++a) {
        float* row = Sh + size_t(a) * d;
        const float* row0 = S0h + size_t(a) * d;
        for (int b = 0; b < d; ++b) row[b] = decay * row0[b];  // works in place (slot == snapshot_slot)
        for (int64_t j = 0; j < keep; ++j) {
          const float ka = w[size_t(j)] * K[j * k.cols + int64_t(kh) * d + a];
          const float* vr = V + j * v.cols + int64_t(kh) * d;
          for (int b = 0; b < d; ++b) row[b] += ka * vr[b];
        }
      }
    }
  });
}

}  // namespace sala
