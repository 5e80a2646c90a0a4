// sala generate [MODEL] "prompt": one answer, streamed to stdout as it is generated; the timing
// summary goes to stderr. MODEL is optional, so one positional is the prompt (default model) and
// two are model + prompt.
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "core/error.h"

namespace sala::cli {
namespace {

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, prompt;
    bool stream = true;
    SamplingOptions sampling;
    SpeculativeCliOptions speculative;
    PromptOptions prompt_opts;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  CLI::Option* model_opt =
      app.add_option("MODEL", o->model, "model directory; omit it (or say 'default') for the built-in random model");
  CLI::Option* prompt_opt = app.add_option("PROMPT", o->prompt, "prompt text ('-' reads it from stdin)");
  app.add_flag("--stream,!--no-stream", o->stream, "print text as it is generated (default) or all at the end");
  o->prompt_opts.add(app);
  o->sampling.add(app);
  o->speculative.add(app);
  o->backend.add(app);
  app.footer("Examples:\n  sala generate \"Tell me a joke\"\n  sala generate MODEL_DIR \"Hello\" --temperature 0 -n 64");
  return [o, model_opt, prompt_opt] {
    // CLI11 fills positionals in order: a lone positional landed in MODEL but is the prompt.
    std::string model = o->model, prompt = o->prompt;
    if (prompt_opt->count() == 0) {
      SALA_CHECK(model_opt->count() > 0, "generate: no PROMPT given (usage: sala generate [MODEL] PROMPT)");
      prompt = model;
      model.clear();
    }
    if (prompt == "-") prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());

    auto s = open_session(resolve_model_ref(model), o->backend, o->sampling, 1, !o->prompt_opts.raw, &o->speculative);
    TextStream text(s->tokenizer, o->prompt_opts.text_options(o->sampling.stop));
    std::string held;  // --no-stream: everything printed at the end
    auto emit = [&](const std::string& piece) {
      if (piece.empty()) return;
      if (!o->stream) {
        held += piece;
        return;
      }
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };

    GenerationRequest req;
    req.prompt = o->prompt_opts.encode(s->tokenizer, prompt);
    req.sampling = o->sampling.resolved();
    req.max_tokens = o->sampling.max_tokens;
    req.ignore_eos = o->sampling.ignore_eos;
    req.on_token = [&](const SampledToken& t) {
      emit(text.push(t.id));
      return !text.stopped();
    };
    s->scheduler->submit(std::move(req));
    s->scheduler->run();
    emit(text.finish());
    held += '\n';
    if (o->stream) std::fputs("\n", stdout);
    else std::fwrite(held.data(), 1, held.size(), stdout);
    std::fflush(stdout);
    print_timing(*s->scheduler, 1);
    return 0;
  };
}

}  // namespace
SALA_COMMAND(generate, "Generate an answer to one prompt (streamed)", setup);
}  // namespace sala::cli
