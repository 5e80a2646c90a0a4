// sala serve --model ID|DIR (or --random PRESET): the OpenAI-compatible HTTP server (see server/api_server.h).
// The HTTP server starts first, so /health answers "loading" while the model loads. SIGINT or
// SIGTERM: stop accepting, end running requests, free the caches, exit 0.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "cli/random_model.h"
#include "core/error.h"
#include "model/presets.h"
#include "server/api_server.h"
#include "server/download_jobs.h"
#include "server/http_server.h"
#include "server/inference_worker.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "tokenizer/chat.h"

namespace sala::cli {
namespace {

using namespace sala::server;

volatile std::sig_atomic_t g_signal = 0;  // set by the SIGINT/SIGTERM handler

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, random, host = "127.0.0.1", api_key, models_dir, cors_origin, reasoning = "parsed", script;
    std::vector<std::string> aliases;
    int port = 8080, max_running = 8, max_queue = 128, max_tokens = -1, load_delay_ms = 0;
    int64_t ctx_size = 4096, prefill_chunk = kDefaultPrefillChunk, batch_tokens = kDefaultPrefillChunk;
    float temperature = 1.0f;
    bool no_think = false;
    SpeculativeCliOptions speculative;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model: a directory, an id in the models directory, or ORG/NAME[@REV] in the "
                                         "Hugging Face cache");
  app.add_option("--random", o->random, "serve random weights of a preset generated on the backend (no checkpoint; "
                                        "model id random-PRESET; for benchmarks)")
      ->check(CLI::IsMember(preset_names()))
      ->excludes("--model");
  app.add_option("--host", o->host, "address to listen on")->capture_default_str();
  app.add_option("--port", o->port, "port (0: any free port)")->capture_default_str();
  app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/* (default: $SALA_API_KEY)");
  app.add_option("--max-running", o->max_running, "requests decoding together (sequence caches)")->capture_default_str();
  app.add_option("--max-queue", o->max_queue, "requests allowed to wait for a free sequence; more get 429")
      ->capture_default_str();
  app.add_option("-c,--ctx-size", o->ctx_size, "tokens per sequence (prompt + generated)")->capture_default_str();
  app.add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per sequence per step")->capture_default_str();
  app.add_option("--batch-tokens", o->batch_tokens, "tokens per step (decode rows + drafts + prompt chunks)")
      ->capture_default_str();
  app.add_option("--models-dir", o->models_dir, "models directory (default: $SALA_MODELS_DIR or ~/.local/share/sala/models)");
  app.add_option("--alias", o->aliases, "another name clients may use in \"model\" (repeatable)");
  app.add_flag("--no-think", o->no_think, "thinking off: empty <think> block in chat prompts, reasoning never shown");
  app.add_option("--reasoning-format", o->reasoning,
                 "default for chat requests: parsed (reasoning_content), raw (left in content), hidden")
      ->check(CLI::IsMember({"parsed", "raw", "hidden"}))
      ->capture_default_str();
  app.add_option("--temperature", o->temperature, "temperature when a request gives none")->capture_default_str();
  app.add_option("--max-tokens", o->max_tokens, "max_tokens when a request gives none (-1: up to the context end)")
      ->capture_default_str();
  app.add_option("--cors-origin", o->cors_origin, "allow browser requests from this origin ('*' for any)");
  o->speculative.add(app);
  o->backend.add(app);
  // Tests only: hold the model load back, so the "loading" state can be observed.
  app.add_option("--debug-load-delay-ms", o->load_delay_ms)->group("");
  // Tests only: every answer's tokens are replaced by those of TEXT (see WorkerOptions::debug_script).
  app.add_option("--debug-script", o->script)->group("");

  return [o] {
    if (o->api_key.empty())
      if (const char* k = std::getenv("SALA_API_KEY")) o->api_key = k;
    ModelRegistry registry(o->models_dir.empty() ? ModelRegistry::default_models_dir() : std::filesystem::path(o->models_dir),
                           ModelRegistry::default_hub_cache());
    SALA_CHECK(o->model.empty() != o->random.empty(), "serve: give --model MODEL or --random PRESET");
    // --random: config and tokenizer in a temporary directory; the weights are generated at load.
    std::unique_ptr<RandomModelDir> random_dir;
    if (!o->random.empty()) random_dir = std::make_unique<RandomModelDir>(o->random);
    const ModelEntry served = random_dir ? ModelEntry{"random-" + o->random, random_dir->path(), "random"}
                                         : registry.resolve(o->model);

    // A handler only records the signal; the control thread acts on it. (Blocking the signals
    // instead would not do: threads a library started before main, e.g. OpenBLAS's, would still
    // take them with the default action.) SA_RESTART keeps syscalls of other threads going.
    struct sigaction sa {};
    sa.sa_handler = [](int sig) { g_signal = sig; };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    Metrics metrics;
    WorkerOptions wo;
    wo.max_running = o->max_running;
    wo.ctx_size = o->ctx_size;
    wo.max_queue = o->max_queue;
    wo.prefill_chunk = o->prefill_chunk;
    wo.speculative = o->speculative.options();
    wo.debug_script = o->script;
    // Room for every decode row, and speculating for one full verify next to them.
    wo.max_batch_tokens = std::max<int64_t>(
        o->batch_tokens, o->max_running + (o->speculative.on() ? o->speculative.draft_tokens : 0));
    InferenceWorker worker(wo, metrics);
    http::Server http;
    const int port = http.listen(o->host, o->port);
    DownloadJobs downloads(registry, DownloadOptions{});

    ApiOptions ao;
    ao.served = served;
    ao.aliases = o->aliases;
    if (served.source == "path") ao.aliases.push_back(std::filesystem::path(served.dir).filename().string());
    ao.api_key = o->api_key;
    ao.cors_origin = o->cors_origin;
    ao.reasoning = parse_reasoning_mode(o->reasoning);
    ao.no_think = o->no_think;
    ao.temperature = o->temperature;
    ao.max_tokens = o->max_tokens;
    SALA_CHECK(o->temperature >= 0, "--temperature must be >= 0");
    ApiServer api(http, worker, metrics, &registry, &downloads, ao);

    const std::filesystem::path dir = served.dir;
    worker.start([o, dir](const ModelLimits& limits) {
      if (o->load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o->load_delay_ms));
      ModelBundle b;
      b.backend = o->backend.make();
      b.model = o->random.empty() ? load_model_verbose(dir.string(), *b.backend, limits)
                                  : random_model(o->random, *b.backend, limits, 0);
      b.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
      if (auto w = chat_template_warning(dir)) std::fprintf(stderr, "warning: %s\n", w->c_str());
      return b;
    });
    std::fprintf(stderr, "sala serve: listening on http://%s:%d (model '%s' from %s, loading)\n", o->host.c_str(),
                 port, served.id.c_str(), served.dir.c_str());

    std::atomic<int> exit_code{0};
    std::thread control([&] {
      bool announced = false;
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int sig = g_signal;
        if (sig != 0) {
          std::fprintf(stderr, "sala serve: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
          break;
        }
        const auto st = worker.state();
        if (st == InferenceWorker::State::Failed) {
          std::fprintf(stderr, "error: %s\n", worker.load_error().c_str());
          exit_code = 1;
          break;
        }
        if (st == InferenceWorker::State::Ready && !announced) {
          announced = true;
          const std::string spec =
              o->speculative.on() ? fmt::format(", speculative {} K {}", o->speculative.mode, o->speculative.draft_tokens)
                                  : "";
          std::fprintf(stderr, "sala serve: model ready (%d sequences of %lld tokens, backend %s%s)\n", o->max_running,
                       (long long)o->ctx_size, o->backend.backend.c_str(), spec.c_str());
        }
      }
      http.stop();
      worker.shutdown();  // running requests end; their handlers return
    });
    http.run();
    control.join();
    return exit_code.load();
  };
}

}  // namespace
SALA_COMMAND(serve, "OpenAI-compatible HTTP server with continuous batching", setup);
}  // namespace sala::cli
