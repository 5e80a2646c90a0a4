// sala quantize IN OUT --format fp8|int8|int4 [--group N] [--symmetric] [--lm-head]: converts a checkpoint to
// a quantized one (docs/quantization.md), one tensor at a time, and prints the error of every
// quantized tensor (relative Frobenius error, max abs error) and the total.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/quant.h"

namespace sala::cli {
namespace {

Runner setup(CLI::App& app) {
  struct Opts {
    std::string in, out, format;
    int group = 64;
    bool symmetric = false, quiet = false, lm_head = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("IN", o->in, "model directory (config.json + safetensors, bf16 or f32)")->required();
  app.add_option("OUT", o->out, "output directory")->required();
  app.add_option("--format", o->format, "fp8 (e4m3, per-channel scale), int8 (per-channel), int4 (group-wise)")
      ->required()
      ->check(CLI::IsMember({"fp8", "int8", "int4"}));
  app.add_option("--group", o->group,
                 "int4 group size along the input dimension: smaller is more accurate, larger decodes faster "
                 "(9B, H100, lm_head packed too: 32 / 64 / 128 at 1.9x / 2.4x / 2.5x bf16's decode rate; docs/quantization.md)")
      ->check(CLI::IsMember({32, 64, 128, 256}))
      ->capture_default_str();
  app.add_flag("--symmetric", o->symmetric,
               "int4: symmetric groups without zero points (default: zero points, measured more accurate)");
  app.add_flag("--lm-head", o->lm_head,
               "quantize lm_head too (default: kept; it is 10% of an int4 decode step's bytes, and its error goes "
               "straight into the logits: see `sala quant-quality`)");
  app.add_flag("--quiet", o->quiet, "print only the total");
  return [o] {
    QuantizeOptions opt;
    opt.format = o->format == "fp8" ? QuantFormat::FP8 : o->format == "int8" ? QuantFormat::INT8 : QuantFormat::INT4;
    opt.group_size = o->group;
    opt.zero_points = opt.format == QuantFormat::INT4 && !o->symmetric;
    opt.lm_head = o->lm_head;
    SALA_CHECK(!o->symmetric || opt.format == QuantFormat::INT4, "--symmetric applies to int4 only");
    if (!o->quiet) std::printf("%-52s %-14s %12s %12s\n", "tensor", "shape", "rel_fro", "max_abs");
    auto report = quantize_checkpoint(o->in, o->out, opt, [&](const QuantizeReport::Row& r) {
      if (o->quiet) return;
      if (!r.kept.empty())
        std::printf("%-52s %-14s %25s\n", r.name.c_str(), shape_str(r.shape).c_str(), ("kept (" + r.kept + ")").c_str());
      else
        std::printf("%-52s %-14s %12.3e %12.3e\n", r.name.c_str(), shape_str(r.shape).c_str(), r.err.rel_fro(),
                    r.err.max_abs);
      std::fflush(stdout);
    });
    int quantized = 0;
    for (auto& r : report.rows) quantized += r.kept.empty();
    std::printf("total: %d tensors quantized (%s%s), rel_fro %.3e, max_abs %.3e, %.2f MiB -> %.2f MiB\n", quantized,
                o->format.c_str(),
                opt.format == QuantFormat::INT4
                    ? (", group " + std::to_string(o->group) + (opt.zero_points ? ", zero points" : ", symmetric")).c_str()
                    : "",
                report.total.rel_fro(), report.total.max_abs, double(report.bytes_in) / (1 << 20),
                double(report.bytes_out) / (1 << 20));
    std::printf("wrote %s\n", o->out.c_str());
    return 0;
  };
}

}  // namespace
SALA_COMMAND(quantize, "Quantize a checkpoint's weights to fp8, int8 or int4", setup);
}  // namespace sala::cli
