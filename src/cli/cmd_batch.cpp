// sala batch [MODEL] --prompts FILE: every prompt of FILE goes to one Scheduler and is decoded
// together with the others (continuous batching, --parallel sequences at once); one JSONL result
// per prompt, in input order. Each result equals running that prompt alone with the same options.
//
// FILE: one prompt per line, as plain text, or (a line starting with '{') a JSON object
//   {"prompt": "...", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
//    "frequency_penalty", "presence_penalty", "seed", "stop": str|[str], "system", "id"}
// where the optional fields override the command-line options for that prompt ("id" is echoed).
// Blank lines are skipped.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "core/error.h"

namespace sala::cli {
namespace {

using nlohmann::json;

struct Item {
  std::string where;  // FILE:LINE, for messages
  std::string prompt;
  std::string system;
  SamplingParams sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;
  json id;  // echoed when given
  // Result.
  std::unique_ptr<TextStream> text;
  int64_t tokens = 0;
  FinishReason finish = FinishReason::Stop;
  bool done = false;
};

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    fail("{}: field \"{}\" has the wrong type ({})", where, key, j.at(key).dump());
  }
}

// Applies one JSON line's fields on top of the defaults already in `item`.
void parse_json_line(const std::string& line, Item& item) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  SALA_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object (lines starting with '{{' are JSON)",
             item.where);
  SALA_CHECK(j.contains("prompt") && j["prompt"].is_string(), "{}: missing string field \"prompt\"", item.where);
  for (auto& [key, value] : j.items()) {
    const std::string& w = item.where;
    if (key == "prompt") item.prompt = value.get<std::string>();
    else if (key == "max_tokens") item.max_tokens = field<int>(j, "max_tokens", w);
    else if (key == "temperature") item.sampling.temperature = field<float>(j, "temperature", w);
    else if (key == "top_p") item.sampling.top_p = field<float>(j, "top_p", w);
    else if (key == "top_k") item.sampling.top_k = field<int>(j, "top_k", w);
    else if (key == "min_p") item.sampling.min_p = field<float>(j, "min_p", w);
    else if (key == "repeat_penalty") item.sampling.repetition_penalty = field<float>(j, "repeat_penalty", w);
    else if (key == "frequency_penalty") item.sampling.frequency_penalty = field<float>(j, "frequency_penalty", w);
    else if (key == "presence_penalty") item.sampling.presence_penalty = field<float>(j, "presence_penalty", w);
    else if (key == "seed") item.sampling.seed = field<uint64_t>(j, "seed", w);
    else if (key == "system") item.system = field<std::string>(j, "system", w);
    else if (key == "id") item.id = value;
    else if (key == "stop") item.stop = value.is_string() ? std::vector<std::string>{value.get<std::string>()}
                                                          : field<std::vector<std::string>>(j, "stop", w);
    else fail("{}: unknown field \"{}\"", w, key);
  }
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, prompts, out;
    int parallel = 8;
    SamplingOptions sampling;
    SpeculativeCliOptions speculative;
    PromptOptions prompt_opts;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory; omit it (or say 'default') for the built-in random model");
  app.add_option("--prompts", o->prompts, "prompts: one per line, plain text or JSON objects ('-' = stdin)")
      ->required();
  app.add_option("--out", o->out, "write the JSONL results here (default: stdout)");
  app.add_option("--parallel", o->parallel, "sequences decoded at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  o->prompt_opts.add(app);
  o->sampling.add(app);
  o->speculative.add(app);
  o->backend.add(app);
  app.footer(
      "Output: one JSON object per prompt, in input order: {\"index\", \"prompt\", \"text\", \"tokens\", "
      "\"finish_reason\"} (+ \"id\" when the input line had one).");
  return [o] {
    // Read and validate every prompt before loading the model.
    std::ifstream file;
    if (o->prompts != "-") {
      file.open(o->prompts, std::ios::binary);
      SALA_CHECK(file.good(), "batch: cannot read --prompts file '{}'", o->prompts);
    }
    std::istream& in = o->prompts == "-" ? std::cin : file;
    const SamplingParams base = o->sampling.resolved();
    std::vector<Item> items;
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t first = line.find_first_not_of(" \t");
      if (first == std::string::npos) continue;
      Item item;
      item.where = fmt::format("{}:{}", o->prompts == "-" ? "stdin" : o->prompts, n);
      item.system = o->prompt_opts.system;
      item.sampling = base;
      item.max_tokens = o->sampling.max_tokens;
      item.stop = o->sampling.stop;
      if (line[first] == '{') parse_json_line(line, item);
      else item.prompt = line;
      SALA_CHECK(item.max_tokens >= 0, "{}: max_tokens must be >= 0, got {}", item.where, item.max_tokens);
      items.push_back(std::move(item));
    }
    SALA_CHECK(!items.empty(), "batch: no prompts in '{}'", o->prompts);

    std::FILE* out = stdout;
    if (!o->out.empty()) {
      out = std::fopen(o->out.c_str(), "wb");
      SALA_CHECK(out, "batch: cannot write --out file '{}'", o->out);
    }
    struct Closer {
      std::FILE* f;
      ~Closer() {
        if (f != stdout) std::fclose(f);
      }
    } closer{out};

    const int parallel = std::min<int>(o->parallel, int(items.size()));
    auto s = open_session(resolve_model_ref(o->model), o->backend, o->sampling, parallel, !o->prompt_opts.raw,
                          &o->speculative);

    // Results are written as soon as every earlier prompt is done, so the output keeps input order.
    size_t next_to_write = 0;
    auto write_ready = [&] {
      for (; next_to_write < items.size() && items[next_to_write].done; ++next_to_write) {
        Item& it = items[next_to_write];
        json r = {{"index", next_to_write}, {"prompt", it.prompt}, {"text", it.text->text()},
                  {"tokens", it.tokens}, {"finish_reason", finish_reason_name(it.finish)}};
        if (!it.id.is_null()) r["id"] = it.id;
        if (std::string reasoning = it.text->reasoning(); !reasoning.empty()) r["reasoning"] = reasoning;
        const std::string text = r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
        std::fwrite(text.data(), 1, text.size(), out);
        std::fflush(out);
      }
    };

    int64_t requests_with_tokens = 0;
    for (Item& it : items) {
      PromptOptions p = o->prompt_opts;
      p.system = it.system;
      it.text = std::make_unique<TextStream>(s->tokenizer, p.text_options(it.stop));
      GenerationRequest req;
      try {
        req.prompt = p.encode(s->tokenizer, it.prompt);
      } catch (const Error& e) {
        fail("{}: {}", it.where, e.what());
      }
      req.sampling = it.sampling;
      req.max_tokens = it.max_tokens;
      req.ignore_eos = o->sampling.ignore_eos;
      req.on_token = [&it](const SampledToken& t) {
        ++it.tokens;
        it.text->push(t.id);
        return !it.text->stopped();
      };
      req.on_finish = [&it, &write_ready](FinishReason why) {
        it.text->finish();
        // A "stop" that no callback asked for was an end-of-sequence token: it was generated too.
        if (why == FinishReason::Stop && !it.text->stopped()) ++it.tokens;
        it.finish = why;
        it.done = true;
        write_ready();
      };
      if (it.max_tokens == 0) {  // nothing to generate (the scheduler only skips such requests at its queue head)
        req.on_finish(FinishReason::Length);
        continue;
      }
      ++requests_with_tokens;
      try {
        s->scheduler->submit(std::move(req));
      } catch (const Error& e) {
        fail("{}: {}", it.where, e.what());
      }
    }

    const auto t0 = std::chrono::steady_clock::now();
    s->scheduler->run();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_ready();

    const SchedulerStats st = s->scheduler->stats();
    std::fprintf(stderr, "batch: %zu prompts, %d at once: %lld generated tokens in %.3f s = %.1f tok/s\n",
                 items.size(), parallel, (long long)st.generated_tokens, wall,
                 wall > 0 ? double(st.generated_tokens) / wall : 0.0);
    print_timing(*s->scheduler, requests_with_tokens);
    return 0;
  };
}

}  // namespace
SALA_COMMAND(batch, "Generate answers to many prompts at once (continuous batching), JSONL out", setup);
}  // namespace sala::cli
