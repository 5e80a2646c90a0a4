// sala perplexity [MODEL] FILE: sliding-window perplexity of a text file (the Hugging Face recipe:
// windows of --ctx tokens every --stride tokens, each scoring only the tokens the previous window
// did not), with progress on stderr and an optional JSON result {ppl, nll, tokens, windows}.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "core/error.h"
#include "engine/perplexity.h"

namespace sala::cli {
namespace {

namespace fs = std::filesystem;

Runner setup(CLI::App& app) {
  struct Opts {
    std::vector<std::string> args;  // [MODEL] FILE
    int64_t ctx = 4096, stride = -1, chunk = 512;
    std::string json;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("ARGS", o->args, "[MODEL] FILE: model directory (default: the built-in random model) and text file")
      ->required()
      ->expected(1, 2);
  app.add_option("--ctx", o->ctx, "tokens per window")->capture_default_str();
  app.add_option("--stride", o->stride, "window advance in tokens (default: ctx/2; ctx = no overlap)");
  app.add_option("--chunk", o->chunk, "tokens per forward inside a window")->capture_default_str();
  app.add_option("--json", o->json, "write {ppl, nll, tokens, windows, ...} here");
  o->backend.add(app);
  return [o] {
    const std::string model_ref = o->args.size() == 2 ? o->args[0] : "";
    const std::string file = o->args.back();
    std::ifstream f(file, std::ios::binary);
    SALA_CHECK(f, "cannot read '{}'", file);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();

    const fs::path dir = resolve_model_dir(resolve_model_ref(model_ref));
    SALA_CHECK(fs::exists(dir / "tokenizer.json"), "model directory '{}' has no tokenizer.json", dir.string());
    const Tokenizer tok = Tokenizer::load(dir);
    const std::vector<int32_t> ids = tok.encode(text, /*add_special_tokens=*/true);
    SALA_CHECK(ids.size() >= 2, "'{}' holds fewer than 2 tokens", file);

    int64_t ctx = std::min<int64_t>(o->ctx, int64_t(ids.size()));
    SALA_CHECK(ctx >= 2, "--ctx must be at least 2, got {}", o->ctx);
    const int64_t stride = o->stride > 0 ? std::min(o->stride, ctx) : std::max<int64_t>(1, ctx / 2);
    const int64_t chunk = std::min(o->chunk > 0 ? o->chunk : ctx, ctx);

    auto backend = o->backend.make();
    LoadedModel m = load_model_verbose(dir.string(), *backend, {.max_batch_tokens = chunk, .max_logit_rows = chunk});
    if (ctx > m.config.max_position_embeddings)
      std::fprintf(stderr, "note: --ctx %lld exceeds the model's max_position_embeddings (%d)\n", (long long)ctx,
                   m.config.max_position_embeddings);
    Engine engine(*m.model, {.max_sequences = 1, .max_context = ctx});

    const bool tty = ::isatty(STDERR_FILENO) != 0;
    const auto t0 = std::chrono::steady_clock::now();
    PerplexityOptions po;
    po.ctx = ctx;
    po.stride = stride;
    po.chunk = chunk;
    po.progress = [&](int64_t w, int64_t total, int64_t scored, double nll_sum) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "%swindow %lld/%lld, %lld tokens scored, running ppl %.4f, %.1f s%s",
                   tty ? "\r" : "", (long long)w, (long long)total, (long long)scored,
                   std::exp(nll_sum / double(std::max<int64_t>(scored, 1))), secs, tty ? "  " : "\n");
      if (tty && w == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    };
    const PerplexityResult r = perplexity(engine, ids, po);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("perplexity %.4f (nll %.6f nats/token) over %lld tokens, %lld windows of %lld (stride %lld)\n", r.ppl,
                r.nll, (long long)r.tokens, (long long)r.windows, (long long)ctx, (long long)stride);
    if (!o->json.empty()) {
      nlohmann::json doc = {{"ppl", r.ppl},         {"nll", r.nll},        {"tokens", r.tokens},
                            {"windows", r.windows}, {"ctx", ctx},          {"stride", stride},
                            {"text_tokens", int64_t(ids.size())},          {"model", dir.string()},
                            {"backend", backend->name()},                  {"random_weights", m.config.random_weights},
                            {"file", file},         {"seconds", secs}};
      std::ofstream out(o->json);
      SALA_CHECK(out, "cannot write '{}'", o->json);
      out << doc.dump(2) << "\n";
    }
    return 0;
  };
}

}  // namespace
SALA_COMMAND(perplexity, "Sliding-window perplexity of a text file", setup);
}  // namespace sala::cli
