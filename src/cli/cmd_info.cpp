// sala info MODEL: config summary, layer layout, parameters and bytes per dtype, tensor table, and
// the cache memory of one sequence (engine/memory.h, the accounting `sala bench` reports).
#include <cstdio>
#include <filesystem>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "engine/memory.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/quant.h"
#include "model/weights.h"

namespace sala::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

void print_memory(const ModelConfig& c, int64_t context, const std::string& cache_dtype) {
  const CacheBytes b = cache_bytes(c, context, 1, cache_dtype == "f32" ? 4.0 : 2.0);
  auto line = [](const char* what, double bytes, const char* note) {
    std::printf("  %-17s %s (%.0f bytes%s)\n", what, human_bytes(bytes).c_str(), bytes, note);
  };
  std::printf("cache per sequence at %lld tokens (whole pages of %d tokens; K/V and K1/K2 in %s):\n",
              (long long)context, c.sparse.block_size, cache_dtype.c_str());
  line("sparse K/V", b.kv, "");
  line("compressed K1/K2", b.compressed, "");
  line("lightning states", b.states, "; fp32, independent of context");
  line("total", b.total(), "");
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, preset, cache_dtype = "bf16";
    bool tensors = false;
    int64_t context = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory (config.json, weights optional) or config.json");
  app.add_option("--preset", o->preset, "describe a preset instead of a directory")
      ->check(CLI::IsMember(preset_names()));
  app.add_flag("--tensors", o->tensors, "print the tensor table");
  app.add_option("--context", o->context, "also print the cache memory of one sequence at this many tokens");
  app.add_option("--cache-dtype", o->cache_dtype, "dtype of K/V and K1/K2 for --context: bf16 (CUDA) or f32 (CPU)")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  return [o] {
    SALA_CHECK(o->model.empty() != o->preset.empty(), "info: give a MODEL directory or --preset");
    ModelConfig c;
    std::unique_ptr<Checkpoint> ckpt;
    QuantConfig quant;
    std::string where;
    if (!o->preset.empty()) {
      c = preset_config(o->preset);
      where = "preset " + o->preset;
    } else {
      auto dir = resolve_model_dir(o->model);
      c = ModelConfig::load(dir / "config.json");
      quant = load_quant_config(dir);
      where = dir.string();
      bool has_weights = false;
      for (auto& e : std::filesystem::directory_iterator(dir))
        has_weights |= e.path().extension() == ".safetensors";
      if (has_weights) ckpt = std::make_unique<Checkpoint>(dir);
      if (ckpt && ckpt->metadata().count("sala_random_weights")) c.random_weights = true;
    }
    std::printf("model: %s%s\n", where.c_str(), c.random_weights ? "  [RANDOM weights]" : "");
    std::printf("hidden %d, intermediate %d, vocab %d, heads %d (sparse kv heads %d, lightning kv heads %d), "
                "head dim %d\n",
                c.hidden_size, c.intermediate_size, c.vocab_size, c.num_heads, c.num_kv_heads, c.lightning_kv_heads,
                c.head_dim);
    std::string sparse_list;
    for (int i = 0; i < c.num_layers; ++i)
      if (c.mixers[size_t(i)] == MixerKind::Sparse) sparse_list += (sparse_list.empty() ? "" : ", ") + std::to_string(i);
    std::printf("layers: %d (%d sparse at %s; %d lightning)\n", c.num_layers, c.count(MixerKind::Sparse),
                sparse_list.c_str(), c.count(MixerKind::Lightning));
    std::string map;
    for (auto m : c.mixers) map += m == MixerKind::Sparse ? 'S' : 'L';
    std::printf("layout: %s\n", map.c_str());
    const auto& s = c.sparse;
    std::printf("sparse: block %d, K1 %d/%d, K2 %d/%d, init %d, window %d (%d blocks), topk %d, dense below %d\n",
                s.block_size, s.kernel_size, s.kernel_stride, s.k2_size(), s.k2_stride(), s.init_blocks,
                s.window_size, s.local_blocks(), s.topk, s.dense_len);
    std::printf("residual scale %.9f, embedding x%g, logits /%g, lightning scale %.9f\n", c.residual_scale(),
                c.scale_emb, c.logit_divisor(), c.lightning_qk_scale());

    std::map<std::string, std::pair<int64_t, double>> per_dtype;  // elements, bytes
    int64_t model_params = 0, stored = 0;
    for (const auto& t : expected_tensors(c)) model_params += shape_numel(t.shape);
    if (ckpt) {
      for (const auto& [name, v] : ckpt->tensors()) {
        auto& e = per_dtype[std::string(dtype_name(v.dtype))];
        e.first += v.numel();
        e.second += double(v.nbytes());
        stored += v.numel();
      }
    } else {
      per_dtype["BF16 (no weights here; as published)"] = {model_params, 2.0 * double(model_params)};
    }
    // A quantized checkpoint stores packed codes, scales and biases: its element counts are not the
    // model's parameters, which come from the model's own (dense) shapes instead.
    const int64_t total = ckpt && !quant.quantized() ? stored : model_params;
    if (quant.quantized()) std::printf("quantization: %s\n", describe_quant_config(quant).c_str());
    std::printf("parameters: %.3f B (%lld)\n", double(total) / 1e9, (long long)total);
    if (quant.quantized()) std::printf("stored as:\n");
    for (const auto& [dt, e] : per_dtype)
      std::printf("  %-8s %14lld %s  %s\n", dt.c_str(), (long long)e.first, quant.quantized() ? "elements" : "params",
                  human_bytes(e.second).c_str());
    if (o->context > 0) print_memory(c, o->context, o->cache_dtype);
    if (o->tensors) {
      for (const auto& t : expected_tensors(c)) {
        std::string dt = "-";
        if (ckpt && ckpt->contains(t.name)) dt = std::string(dtype_name(ckpt->get(t.name).dtype));
        std::printf("  %-52s %-16s %s\n", t.name.c_str(), shape_str(t.shape).c_str(), dt.c_str());
      }
    }
    return 0;
  };
}

}  // namespace
SALA_COMMAND(info, "Describe a model: config, layer layout, parameters, tensors", setup);
}  // namespace sala::cli
