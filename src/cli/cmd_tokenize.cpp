// sala tokenize MODEL "text": token ids of a text (or of a chat prompt) with the model's tokenizer.json.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace sala::cli {
namespace {

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, text, jsonl, system;
    bool pieces = false, no_special = false, chat = false, no_think = false, no_markers = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory holding tokenizer.json (or the tokenizer.json file)")->required();
  CLI::Option* text_opt = app.add_option("TEXT", o->text, "text to encode (give it or --jsonl)");
  app.add_flag("--pieces", o->pieces, "also print the pieces, as a JSON array on a second line");
  app.add_flag("--no-special", o->no_special, "do not add the BOS token (add_special_tokens=false)");
  app.add_flag("--chat", o->chat,
               "treat TEXT as one user message: print the ChatML prompt (with the generation prompt), then its ids");
  app.add_option("--system", o->system, "with --chat: system prompt");
  app.add_flag("--no-think", o->no_think, "with --chat: append the empty <think> block (thinking off)");
  app.add_flag("--no-markers", o->no_markers,
               "do not treat the reasoning markers (<think>, ids 101-114) as added tokens; matches HF tokenizers "
               "loading tokenizer.json alone");
  app.add_option("--jsonl", o->jsonl,
                 "read one JSON string per line from FILE ('-' = stdin); write one JSON array of ids per line");
  app.footer(
      "Output: the ids on one line, separated by spaces. Special-token strings in the text (<s>, <|im_start|>, ...) "
      "become their ids, as in HF tokenizers.");
  return [o, text_opt] {
    SALA_CHECK((text_opt->count() > 0) != !o->jsonl.empty(), "tokenize: give TEXT or --jsonl (one of them)");
    SALA_CHECK(o->chat || (o->system.empty() && !o->no_think), "tokenize: --system and --no-think need --chat");
    Tokenizer::Options topt;
    topt.reasoning_markers_as_added = !o->no_markers;
    Tokenizer tok = Tokenizer::load(o->model, topt);
    if (o->chat && std::filesystem::is_directory(o->model))
      if (auto w = chat_template_warning(o->model)) std::fprintf(stderr, "warning: %s\n", w->c_str());
    ChatOptions copt;
    copt.system_prompt = o->system;
    copt.enable_thinking = !o->no_think;

    auto encode = [&](const std::string& text) {
      if (!o->chat) return tok.encode(text, !o->no_special);
      std::vector<ChatMessage> msgs = {{"user", text}};
      return tok.encode(format_chat(msgs, copt), !o->no_special);
    };

    if (!o->jsonl.empty()) {
      std::ifstream file;
      if (o->jsonl != "-") {
        file.open(o->jsonl);
        SALA_CHECK(file.good(), "tokenize: cannot read --jsonl file {}", o->jsonl);
      }
      std::istream& in = o->jsonl == "-" ? std::cin : file;
      std::string line;
      for (size_t n = 1; std::getline(in, line); ++n) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        SALA_CHECK(!j.is_discarded() && j.is_string(), "tokenize: {} line {} is not a JSON string", o->jsonl, n);
        std::string out = nlohmann::json(encode(j.get<std::string>())).dump();
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fputc('\n', stdout);
      }
      return 0;
    }

    if (o->chat) {
      std::vector<ChatMessage> msgs = {{"user", o->text}};
      std::string prompt = format_chat(msgs, copt);
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    }
    auto ids = encode(o->text);
    std::printf("%s\n", join_ids(ids).c_str());
    if (o->pieces) {
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
      std::printf("%s\n", pieces.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return 0;
  };
}

}  // namespace

SALA_COMMAND(tokenize, "Encode text (or a chat prompt) to token ids with a model's tokenizer.json", setup);

}  // namespace sala::cli
