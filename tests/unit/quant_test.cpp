// Quantized weights (docs/quantization.md): packing, per-format quantize/dequantize, the MLX affine
// layout, loading quantized checkpoints on the CPU backend (logits close to the f32 model's), and
// the errors of malformed quantized checkpoints. The QuantQuality test measures the numbers of
// bench/results/quant-quality-cpu.md on the tiny golden model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_layout.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "engine/logit_stats.h"
#include "engine/replay.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/quant.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

using namespace sala;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() / ("sala_quant_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

std::vector<int32_t> tokens(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[size_t(i)] = int32_t(3 + int(std::fabs(normal01(seed, uint64_t(i))) * 1e6) % (vocab - 3));
  return t;
}

std::vector<float> run_logits(const fs::path& dir, const std::vector<int32_t>& seq, int64_t chunk,
                              int64_t decode = 0) {
  CpuBackend backend(2);
  LoadedModel m = load_model(dir.string(), backend, {.max_batch_tokens = chunk, .max_logit_rows = chunk});
  Engine engine(*m.model, {.max_sequences = 1, .max_context = int64_t(seq.size())});
  return replay(engine, {seq}, {int64_t(seq.size()) - decode, chunk, true})[0];
}

// Copies a checkpoint directory, letting `edit` drop or replace tensors and change config.json.
void rewrite(const fs::path& src, const fs::path& dst,
             const std::function<bool(const std::string&, TensorView&)>& keep,
             const std::function<void(nlohmann::json&)>& edit_config = {}) {
  fs::create_directories(dst);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  if (edit_config) edit_config(cfg);
  std::ofstream(dst / "config.json") << cfg.dump(2);
  Checkpoint ck(src);
  SafetensorsWriter w;
  for (auto [name, v] : ck.tensors())
    if (keep(name, v)) w.add(name, v);
  w.write(dst / "model.safetensors");
}

std::string load_error(const fs::path& dir) {
  CpuBackend backend(1);
  try {
    load_model(dir.string(), backend, {.max_batch_tokens = 8, .max_logit_rows = 8});
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST(QuantPack, Int4NibblesSignedAndUnsigned) {
  for (int lo = -8; lo <= 7; ++lo)
    for (int hi = -8; hi <= 7; ++hi) {
      const uint8_t b = pack_int4(lo, hi);
      EXPECT_EQ(unpack_int4_signed(b, 0), lo);
      EXPECT_EQ(unpack_int4_signed(b, 1), hi);
    }
  EXPECT_EQ(pack_int4(7, -7), 0x97);  // -7 = 0b1001 in the high nibble
  EXPECT_EQ(pack_int4(-1, 3), 0x3f);
  EXPECT_EQ(unpack_int4_unsigned(0xa5, 0), 5);
  EXPECT_EQ(unpack_int4_unsigned(0xa5, 1), 10);
}

TEST(QuantPack, Int4SymmetricGroupsAreIndependent) {
  // Two groups of 4: scales amax/7 each; odd and negative values, the second group's scale must not
  // leak into the first. Scales are rounded up to 7 significant bits (an f16 whose low four bits the
  // CUDA backend holds z in): 0.1 → 103/1024, 8/7 → 74/64.
  const float w[8] = {0.7f, -0.7f, 0.1f, -0.3f, 8.f, -1.f, 2.f, 0.f};
  QuantizedMatrix q = quantize_matrix(w, 1, 8, QuantFormat::INT4, 4, false);
  ASSERT_EQ(q.data_shape(), (Shape{1, 4}));
  ASSERT_EQ(q.scale_shape(), (Shape{1, 2}));
  EXPECT_EQ(q.scales[0], 103.f / 1024.f);  // exact in f16, the value the backends hold
  EXPECT_EQ(q.scales[1], 74.f / 64.f);
  EXPECT_EQ(q.data[0], pack_int4(7, -7));
  EXPECT_EQ(q.data[1], pack_int4(1, -3));
  EXPECT_EQ(unpack_int4_signed(q.data[2], 0), 7);
  EXPECT_EQ(unpack_int4_signed(q.data[2], 1), -1);  // -1 / (8/7) = -0.875 -> -1
  float back[8];
  dequantize_matrix(q, back);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], w[i], 0.05f + 1e-6f) << i;
  for (int i = 4; i < 8; ++i) EXPECT_NEAR(back[i], w[i], 4.f / 7.f + 1e-6f) << i;
  EXPECT_EQ(back[0], 7.f * q.scales[0]);  // 7 · the stored scale (≤ 0.8% above amax)
  EXPECT_EQ(back[4], 7.f * q.scales[1]);
}

TEST(QuantPack, Int4ZeroPointsCoverAsymmetricRange) {
  // All-positive group: symmetric int4 wastes half its codes, zero points use all 16.
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[size_t(i)] = 1.f + float(i) / 63.f;
  QuantizedMatrix z = quantize_matrix(w.data(), 1, 64, QuantFormat::INT4, 64, true);
  QuantizedMatrix s = quantize_matrix(w.data(), 1, 64, QuantFormat::INT4, 64, false);
  ASSERT_EQ(z.zeros.size(), 1u);
  EXPECT_EQ(z.zeros[0], 0);  // min clamped to 0 keeps zero exact
  std::vector<float> bz(64), bs(64);
  dequantize_matrix(z, bz.data());
  dequantize_matrix(s, bs.data());
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(bz[size_t(i)], w[size_t(i)], z.scales[0] / 2 + 1e-6f);
  QuantError ez, es;
  ez.add(w.data(), bz.data(), 64);
  es.add(w.data(), bs.data(), 64);
  EXPECT_LE(ez.max_abs, z.scales[0] / 2 + 1e-6);
  // A group with negative values: zero point in the middle.
  const float n[4] = {-3.f, -1.f, 0.f, 1.5f};
  QuantizedMatrix qn = quantize_matrix(n, 1, 4, QuantFormat::INT4, 4, true);
  // The scale 0.3 rounded up to 7 significant bits (int4_scale): 77/128 · 2^-1.
  EXPECT_EQ(qn.scales[0], 0.30078125f);
  EXPECT_EQ(qn.zeros[0], 10);  // round(3 / 0.3008)
  float bn[4];
  dequantize_matrix(qn, bn);
  EXPECT_FLOAT_EQ(bn[2], 0.f);
  EXPECT_NEAR(bn[0], -3.f, qn.scales[0] / 2);
}

// The int4 quantizer compares a few narrower ranges per group with the full one and keeps the
// least squared error (quant.cpp, kInt4Clips): on Gaussian groups, clearly less error than
// rounding on each group's full range (computed here in double, with unrounded scales — a grid a
// hair finer than the stored one).
TEST(QuantPack, Int4ClipSearchBeatsTheFullRangeOnGaussianGroups) {
  const int64_t rows = 64, cols = 512;
  std::vector<float> w(size_t(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * normal01(77, i);
  for (const int group : {64, 128})
    for (const bool zp : {true, false}) {
      SCOPED_TRACE(testing::Message() << "group " << group << (zp ? " zero points" : " symmetric"));
      const QuantizedMatrix q = quantize_matrix(w.data(), rows, cols, QuantFormat::INT4, group, zp);
      std::vector<float> back(w.size());
      dequantize_matrix(q, back.data());
      double got = 0, full = 0;
      for (size_t g0 = 0; g0 < w.size(); g0 += size_t(group)) {
        double mn = 0, mx = 0, amax = 0;
        for (int j = 0; j < group; ++j) {
          const double x = w[g0 + size_t(j)];
          mn = std::min(mn, x), mx = std::max(mx, x), amax = std::max(amax, std::fabs(x));
        }
        const double s = zp ? (mx - mn) / 15 : amax / 7, z = zp ? std::nearbyint(-mn / s) : 0;
        for (int j = 0; j < group; ++j) {
          const double x = w[g0 + size_t(j)];
          const double v = std::clamp(std::nearbyint(x / s) + z, zp ? 0.0 : -8.0, zp ? 15.0 : 7.0);
          full += (s * (v - z) - x) * (s * (v - z) - x);
          got += (double(back[g0 + size_t(j)]) - x) * (double(back[g0 + size_t(j)]) - x);
        }
      }
      EXPECT_LT(got, 0.96 * full) << "squared error " << got << " against the full range's " << full;
    }
}

TEST(QuantPack, Int4BiasesAreExactInF16) {
  // The backends hold grouped scales and biases as f16 (backend.h); the quantizer's scales make
  // the packed bias −s·z (−8·s symmetric) an exact f16, so packed products equal the checkpoint's
  // dequantized values. Weights over several magnitudes, both variants.
  std::vector<float> w(size_t(32 * 256));
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::ldexp(float(int((i * 2654435761u) % 2001) - 900) / 1000.f, -int(i / 512) % 12);
  for (const bool zp : {true, false}) {
    const PackedMatrix p = pack_matrix(quantize_matrix(w.data(), 32, 256, QuantFormat::INT4, 64, zp));
    for (size_t i = 0; i < p.scales.size(); ++i) {
      ASSERT_EQ(qlayout::group_param(p.scales[i]), p.scales[i]) << i;
      ASSERT_EQ(qlayout::group_param(p.biases[i]), p.biases[i]) << i << (zp ? " zero points" : " symmetric");
    }
  }
}

TEST(QuantPack, Fp8AndInt8PerChannel) {
  const float w[6] = {1.f, -2.f, 0.5f, 0.f, 0.f, 0.f};  // second row all zero: scale 1, exact zeros
  for (QuantFormat f : {QuantFormat::FP8, QuantFormat::INT8}) {
    QuantizedMatrix q = quantize_matrix(w, 2, 3, f, 0, false);
    ASSERT_EQ(q.scale_shape(), (Shape{2}));
    EXPECT_FLOAT_EQ(q.scales[0], 2.f / (f == QuantFormat::FP8 ? 448.f : 127.f));
    EXPECT_FLOAT_EQ(q.scales[1], 1.f);
    float back[6];
    dequantize_matrix(q, back);
    EXPECT_NEAR(back[1], -2.f, 1e-6);  // amax maps exactly
    EXPECT_NEAR(back[0], 1.f, f == QuantFormat::FP8 ? 1.f / 16 : 2.f / 127);
    for (int i = 3; i < 6; ++i) EXPECT_EQ(back[i], 0.f);
  }
  const float x[2] = {-1.f, 0.25f};
  QuantizedMatrix q8 = quantize_matrix(x, 1, 2, QuantFormat::INT8, 0, false);
  EXPECT_EQ(int8_t(q8.data[0]), -127);
  EXPECT_EQ(int8_t(q8.data[1]), 32);  // 31.75 -> 32
}

TEST(QuantPack, Int4RejectsColumnsOutsideGroups) {
  std::vector<float> w(96, 1.f);
  try {
    quantize_matrix(w.data(), 1, 96, QuantFormat::INT4, 64, false, 4, "layer.x.weight");
    FAIL() << "accepted 96 columns with group 64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.x.weight"), std::string::npos) << e.what();
  }
}

TEST(QuantMlx, HandComputedDequantization) {
  // 4 bits, group 8: one uint32 holds q = 0..7, little end first; w = scale * q + bias with bf16
  // scale 0.5 and bias -1 -> w[j] = 0.5 j - 1.
  const uint32_t word4[2] = {0x76543210u, 0x0000000fu};  // second group: q = 15, 0, 0, ...
  const uint16_t scales4[2] = {f32_to_bf16(0.5f), f32_to_bf16(0.25f)};
  const uint16_t biases4[2] = {f32_to_bf16(-1.f), f32_to_bf16(2.f)};
  TensorView d{word4, DType::U32, {1, 2}}, s{scales4, DType::BF16, {1, 2}}, b{biases4, DType::BF16, {1, 2}};
  float out[16];
  dequantize_views(QuantFormat::MLX, 8, 4, 1, 16, d, s, nullptr, &b, out);
  for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(out[j], 0.5f * float(j) - 1.f) << j;
  EXPECT_FLOAT_EQ(out[3], 0.5f);
  EXPECT_FLOAT_EQ(out[8], 0.25f * 15.f + 2.f);  // 5.75
  EXPECT_FLOAT_EQ(out[9], 2.f);
  // 8 bits: 4 values per word, q = 1, 2, 3, 250; f16 scales.
  const uint32_t word8[1] = {0xfa030201u};
  const uint16_t s8[1] = {f32_to_f16(0.125f)}, b8[1] = {f32_to_f16(-0.5f)};
  TensorView d8{word8, DType::U32, {1, 1}}, sv8{s8, DType::F16, {1, 1}}, bv8{b8, DType::F16, {1, 1}};
  float o8[4];
  dequantize_views(QuantFormat::MLX, 4, 8, 1, 4, d8, sv8, nullptr, &bv8, o8);
  EXPECT_FLOAT_EQ(o8[0], -0.375f);
  EXPECT_FLOAT_EQ(o8[1], -0.25f);
  EXPECT_FLOAT_EQ(o8[2], -0.125f);
  EXPECT_FLOAT_EQ(o8[3], 0.125f * 250.f - 0.5f);
}

TEST(QuantConfigParse, Sections) {
  using nlohmann::json;
  EXPECT_FALSE(parse_quant_config(json{{"vocab_size", 5}}).quantized());
  auto q = parse_quant_config(json{{"quantization", {{"format", "int4"}, {"group_size", 128}}}});
  EXPECT_EQ(q.format, QuantFormat::INT4);
  EXPECT_EQ(q.group_size, 128);
  q = parse_quant_config(json{{"quantization", {{"group_size", 64}, {"bits", 8}}}});
  EXPECT_EQ(q.format, QuantFormat::MLX);
  EXPECT_EQ(q.bits, 8);
  auto err = [](const json& j) {
    try {
      parse_quant_config(j, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(err(json{{"quantization", {{"format", "int3"}}}}).find("cfg.json: field 'quantization.format' = \"int3\""),
            std::string::npos);
  EXPECT_NE(err(json{{"quantization", {{"format", "int4"}}}}).find("quantization.group_size"), std::string::npos);
  EXPECT_NE(err(json{{"quantization", {{"bits", 3}, {"group_size", 64}}}}).find("quantization.bits"),
            std::string::npos);
  // The line `sala info` prints.
  EXPECT_EQ(describe_quant_config(parse_quant_config(json{{"quantization", {{"group_size", 32}, {"bits", 4}}}})),
            "MLX affine, 4-bit, groups of 32");
  EXPECT_EQ(describe_quant_config(parse_quant_config(
                json{{"quantization", {{"format", "int4"}, {"group_size", 128}, {"zero_points", false}}}})),
            "int4, groups of 128, symmetric");
  EXPECT_EQ(describe_quant_config(parse_quant_config(json{{"quantization", {{"format", "fp8"}}}})),
            "fp8, one scale per output channel");
}

// Round trip on the tiny preset: quantize -> load -> logits close to the f32 model's, within the
// bounds docs/quantization.md reports (the measured values are several times smaller).
TEST(QuantRoundTrip, TinyEveryFormat) {
  TmpDir tmp;
  const ModelConfig cfg = preset_config("tiny");
  write_random_checkpoint(tmp.path / "f32", cfg, {.seed = 7, .dtype = DType::F32});
  const auto seq = tokens(300, cfg.vocab_size, 11);  // > dense_len: the sparse path too
  const auto ref = run_logits(tmp.path / "f32", seq, 64);
  struct Case {
    const char* name;
    QuantizeOptions opt;
    double max_weight_err, max_logit_err, min_top1;
  };
  const Case cases[] = {
      {"fp8", {QuantFormat::FP8, 0, false, 4}, 0.04, 0.08, 0.85},
      {"int8", {QuantFormat::INT8, 0, false, 4}, 0.01, 0.03, 0.93},
      {"int4-g64", {QuantFormat::INT4, 64, false, 4}, 0.15, 0.3, 0.6},
      {"int4-g64-zp", {QuantFormat::INT4, 64, true, 4}, 0.15, 0.3, 0.6},
      {"mlx4-g64", {QuantFormat::MLX, 64, false, 4}, 0.15, 0.3, 0.6},
      {"mlx8-g64", {QuantFormat::MLX, 64, false, 8}, 0.02, 0.03, 0.9},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path out = tmp.path / c.name;
    QuantizeReport rep = quantize_checkpoint(tmp.path / "f32", out, c.opt);
    EXPECT_LT(rep.total.rel_fro(), c.max_weight_err);
    EXPECT_LT(rep.bytes_out, rep.bytes_in);
    const auto got = run_logits(out, seq, 64);
    ASSERT_EQ(got.size(), ref.size());
    const LogitStats s = compare_logits(ref, got, cfg.vocab_size);
    std::printf("[ round trip ] %-12s weights rel_fro %.4f  logits rel %.4f  top1 %.3f  KL %.2e\n", c.name,
                rep.total.rel_fro(), s.rel, s.top1, s.kl);
    EXPECT_LT(s.rel, c.max_logit_err);
    EXPECT_GE(s.top1, c.min_top1);
    EXPECT_GT(s.rel, 0.0);  // it really is the quantized model
  }
}

// The statistics of the quality tables on a hand-computed case, serial and on a pool.
TEST(CompareLogits, HandComputedAndParallel) {
  const std::vector<float> ref = {0, 0, 1, 0}, got = {0, 0, 0, 1};  // 2 positions, vocabulary 2
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const LogitStats s = compare_logits(ref, got, 2, p);
    const double e = std::exp(1.0), kl1 = (e - 1) / (e + 1);  // KL((e,1)/(e+1) ‖ (1,e)/(e+1))
    EXPECT_EQ(s.positions, 2);
    EXPECT_DOUBLE_EQ(s.rel, std::sqrt(2.0));
    EXPECT_DOUBLE_EQ(s.top1, 0.5);
    EXPECT_NEAR(s.kl, kl1 / 2, 1e-12);
    EXPECT_NEAR(s.max_kl, kl1, 1e-12);
  }
  EXPECT_THROW(compare_logits(ref, std::vector<float>(3), 2), Error);
}

// Rows on a thread pool (what `sala quantize` and quantize_weights use) give the bytes of one pass.
TEST(QuantPack, ParallelRowsGiveTheSameBytes) {
  const int64_t rows = 37, cols = 128;
  std::vector<float> w(size_t(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = normal01(11, i) * (1.f + float(i % 7));
  ThreadPool pool(3);
  const std::pair<QuantFormat, bool> cases[] = {{QuantFormat::FP8, false}, {QuantFormat::INT8, false},
                                                {QuantFormat::INT4, true},  {QuantFormat::INT4, false},
                                                {QuantFormat::MLX, false}};
  for (const auto& [f, zp] : cases)
    for (int bits : {4, 8}) {
      if (f != QuantFormat::MLX && bits == 8) continue;
      SCOPED_TRACE(quant_format_name(f) + (zp ? " zero points" : "") + " bits " + std::to_string(bits));
      const QuantizedMatrix a = quantize_matrix(w.data(), rows, cols, f, 32, zp, bits);
      const QuantizedMatrix b = quantize_matrix(w.data(), rows, cols, f, 32, zp, bits, "w", &pool);
      EXPECT_EQ(a.data, b.data);
      EXPECT_EQ(a.scales, b.scales);
      EXPECT_EQ(a.zeros, b.zeros);
      EXPECT_EQ(a.biases, b.biases);
      EXPECT_FALSE(a.data.empty());
    }
}

// quantize_weights (`sala quant-quality`) quantizes the loaded dense weights exactly as
// `sala quantize` writes the checkpoint: the same logits, bit for bit (CPU, f32 golden weights).
TEST(QuantQuality, InMemoryQuantizationMatchesTheConverter) {
  TmpDir tmp;
  const fs::path golden = fs::path(SALA_TEST_DATA) / "golden/tiny";
  const ModelConfig cfg = ModelConfig::load(golden);
  const auto seq = tokens(96, cfg.vocab_size, 7);
  QuantizeOptions lm{QuantFormat::FP8, 0, false, 4};
  lm.lm_head = true;
  const std::pair<const char*, QuantizeOptions> cases[] = {
      {"fp8", {QuantFormat::FP8, 0, false, 4}}, {"int4 g32 zp", {QuantFormat::INT4, 32, true, 4}}, {"fp8 + lm_head", lm}};
  for (const auto& [name, opt] : cases) {
    SCOPED_TRACE(name);
    const fs::path out = tmp.path / name;
    const QuantizeReport rep = quantize_checkpoint(golden, out, opt);
    int quantized = 0;
    for (const auto& r : rep.rows) quantized += r.kept.empty();
    EXPECT_EQ(quantized, opt.lm_head ? 33 : 32);
    const auto want = run_logits(out, seq, 32, 16);

    CpuBackend backend(2);
    ModelWeights w = bind_weights(cfg, Checkpoint(golden), backend);
    quantize_weights(cfg, w, backend, opt);
    EXPECT_EQ(w.lm_head.packed(), opt.lm_head);
    EXPECT_TRUE(w.layers[0].gate.packed());
    EXPECT_FALSE(w.embed.packed());
    Model model(cfg, std::move(w), backend, {.max_batch_tokens = 32, .max_logit_rows = 32});
    Engine engine(model, {.max_sequences = 1, .max_context = int64_t(seq.size())});
    const auto got = replay(engine, {seq}, {int64_t(seq.size()) - 16, 32, true})[0];
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    const LogitStats s = compare_logits(run_logits(golden, seq, 32, 16), got, cfg.vocab_size);
    EXPECT_GT(s.rel, 0.0);  // really quantized
    EXPECT_LT(s.rel, 0.3);
  }
}

TEST(QuantErrors, MalformedCheckpointsNameTheTensorOrField) {
  TmpDir tmp;
  write_random_checkpoint(tmp.path / "f32", preset_config("tiny"), {.seed = 1, .dtype = DType::F32});
  quantize_checkpoint(tmp.path / "f32", tmp.path / "q", {QuantFormat::INT4, 64, false, 4});
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";

  rewrite(tmp.path / "q", tmp.path / "noscale", [&](const std::string& n, TensorView&) { return n != gate + "_scale"; });
  std::string e = load_error(tmp.path / "noscale");
  EXPECT_NE(e.find("missing tensors (1)"), std::string::npos) << e;
  EXPECT_NE(e.find(gate + "_scale"), std::string::npos) << e;

  std::vector<float> bad(128 * 3, 1.f);
  rewrite(tmp.path / "q", tmp.path / "badscale", [&](const std::string& n, TensorView& v) {
    if (n == gate + "_scale") v = TensorView{bad.data(), DType::F32, {128, 3}};
    return true;
  });
  e = load_error(tmp.path / "badscale");
  EXPECT_NE(e.find(gate + "_scale is [128, 3] (expected [128, 1] for [128, 64] with group_size 64)"),
            std::string::npos)
      << e;

  rewrite(tmp.path / "q", tmp.path / "badpack", [&](const std::string& n, TensorView& v) {
    if (n == gate) v.shape = {64, 64};  // same bytes, wrong packed shape
    return true;
  });
  e = load_error(tmp.path / "badpack");
  EXPECT_NE(e.find(gate + " is U8 [64, 64] (expected U8 [128, 32]: [128, 64] packed as int4)"), std::string::npos)
      << e;

  rewrite(
      tmp.path / "q", tmp.path / "unknown", [](const std::string&, TensorView&) { return true; },
      [](nlohmann::json& j) { j["quantization"]["format"] = "int3"; });
  e = load_error(tmp.path / "unknown");
  EXPECT_NE(e.find("field 'quantization.format' = \"int3\""), std::string::npos) << e;

  // A quantized checkpoint whose config lost its section: packed tensors are not floats.
  rewrite(
      tmp.path / "q", tmp.path / "nosection", [](const std::string&, TensorView&) { return true; },
      [](nlohmann::json& j) { j.erase("quantization"); });
  e = load_error(tmp.path / "nosection");
  EXPECT_NE(e.find(gate + " is [128, 32] (expected [128, 64])"), std::string::npos) << e;
  EXPECT_NE(e.find(gate + "_scale"), std::string::npos) << e;  // listed as unexpected

  // MLX: biases missing.
  quantize_checkpoint(tmp.path / "f32", tmp.path / "mlx", {QuantFormat::MLX, 64, false, 4});
  rewrite(tmp.path / "mlx", tmp.path / "mlx_nobias", [&](const std::string& n, TensorView&) {
    return n != "model.layers.1.self_attn.q_proj.biases";
  });
  e = load_error(tmp.path / "mlx_nobias");
  EXPECT_NE(e.find("missing tensors (1):\n    model.layers.1.self_attn.q_proj.biases"), std::string::npos) << e;
}

// The quality table of bench/results/quant-quality-cpu.md: the tiny golden model (f32) against its
// quantized versions over 2048 positions (prefill in chunks of 256, then 64 decode steps).
// SALA_QUANT_QUALITY_PRESET=small also runs a random `small` preset checkpoint (slow);
// SALA_QUANT_QUALITY_PRESET=9b-slice a random checkpoint of the 9B preset's widths (hidden 4096,
// intermediate 16384, vocabulary 73448, its heads) with 2 of its 32 layers, one of each kind (~1.1B
// parameters, 4.6 GB in f32: minutes on 2 cores).
TEST(QuantQuality, TinyGoldenModel) {
  TmpDir tmp;
  const fs::path golden = fs::path(SALA_TEST_DATA) / "golden/tiny";
  ASSERT_TRUE(fs::exists(golden / "model.safetensors"));
  struct Model {
    std::string label;
    fs::path dir;
    int positions;
  };
  std::vector<Model> models = {{"tiny golden (random weights, f32)", golden, 2048}};
  if (const char* p = std::getenv("SALA_QUANT_QUALITY_PRESET"); p && std::string(p) == "small") {
    write_random_checkpoint(tmp.path / "small", preset_config("small"), {.seed = 5, .dtype = DType::F32});
    models.push_back({"small preset (random weights, f32, seed 5)", tmp.path / "small", 1024});
  } else if (p && std::string(p) == "9b-slice") {
    ModelConfig c = preset_config("9b");
    c.num_layers = 2;
    c.mixers = {MixerKind::Sparse, MixerKind::Lightning};
    c.validate("9b slice");
    write_random_checkpoint(tmp.path / "9b-slice", c, {.seed = 9, .dtype = DType::F32});
    models.push_back({"9B-shaped slice, 2 layers (random weights, f32, seed 9)", tmp.path / "9b-slice", 1024});
  }
  const std::pair<const char*, QuantizeOptions> formats[] = {
      {"fp8 e4m3 / channel", {QuantFormat::FP8, 0, false, 4}},
      {"int8 / channel", {QuantFormat::INT8, 0, false, 4}},
      {"int4 g64 sym", {QuantFormat::INT4, 64, false, 4}},
      {"int4 g64 zero-pt", {QuantFormat::INT4, 64, true, 4}},
      {"int4 g128 sym", {QuantFormat::INT4, 128, false, 4}},
      {"int4 g128 zero-pt", {QuantFormat::INT4, 128, true, 4}},
  };
  for (const Model& m : models) {
    const ModelConfig cfg = ModelConfig::load(m.dir);
    const auto seq = tokens(m.positions, cfg.vocab_size, 2024);
    const auto ref = run_logits(m.dir, seq, 256, 64);
    std::printf("| model | format | weight rel. Frobenius | logit rel. error | top-1 agreement | mean KL |\n");
    int i = 0;
    for (const auto& [name, opt] : formats) {
      if (opt.format == QuantFormat::INT4 && (cfg.hidden_size % opt.group_size || cfg.intermediate_size % opt.group_size))
        continue;  // tiny: 64 input columns do not hold a group of 128
      const fs::path out = tmp.path / ("q" + std::to_string(i++));
      QuantizeReport rep = quantize_checkpoint(m.dir, out, opt);
      const auto got = run_logits(out, seq, 256, 64);
      const LogitStats s = compare_logits(ref, got, cfg.vocab_size);
      std::printf("| %s | %s | %.4f | %.4f | %.4f | %.2e |\n", m.label.c_str(), name, rep.total.rel_fro(), s.rel,
                  s.top1, s.kl);
      EXPECT_LT(s.rel, 0.3);
      // Random weights give near-flat logits over the real 73448-word vocabulary (small preset):
      // top-1 flips easily there, so its floor is lower.
      EXPECT_GT(s.top1, cfg.vocab_size > 10000 ? 0.45 : 0.6);
      fs::remove_all(out);
    }
  }
}
