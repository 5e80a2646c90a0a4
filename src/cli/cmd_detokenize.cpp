// sala detokenize MODEL ID ID ...: text of token ids with the model's tokenizer.json.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace sala::cli {
namespace {

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model, jsonl;
    std::vector<int32_t> ids;
    bool skip_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory holding tokenizer.json (or the tokenizer.json file)")->required();
  app.add_option("IDS", o->ids, "token ids (give them or --jsonl)");
  app.add_flag("--skip-special", o->skip_special, "leave out special tokens (<s>, </s>, <|im_end|>, ...)");
  app.add_option("--jsonl", o->jsonl,
                 "read one JSON array of ids per line from FILE ('-' = stdin); write one JSON string per line");
  app.footer(
      "Output: the decoded text followed by a newline. Byte pieces that do not form valid UTF-8 become U+FFFD, "
      "one per byte, as in HF tokenizers.");
  return [o] {
    SALA_CHECK(o->ids.empty() || o->jsonl.empty(), "detokenize: give IDS or --jsonl, not both");
    Tokenizer tok = Tokenizer::load(o->model);
    if (o->jsonl.empty()) {
      std::string text = tok.decode(o->ids, o->skip_special);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
      return 0;
    }
    std::ifstream file;
    if (o->jsonl != "-") {
      file.open(o->jsonl);
      SALA_CHECK(file.good(), "detokenize: cannot read --jsonl file {}", o->jsonl);
    }
    std::istream& in = o->jsonl == "-" ? std::cin : file;
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      SALA_CHECK(!j.is_discarded() && j.is_array(), "detokenize: {} line {} is not a JSON array of ids", o->jsonl, n);
      std::vector<int32_t> ids;
      for (const auto& v : j) {
        SALA_CHECK(v.is_number_integer(), "detokenize: {} line {}: {} is not an integer id", o->jsonl, n, v.dump());
        ids.push_back(v.get<int32_t>());
      }
      std::string out = nlohmann::json(tok.decode(ids, o->skip_special)).dump();
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fputc('\n', stdout);
    }
    return 0;
  };
}

}  // namespace

SALA_COMMAND(detokenize, "Decode token ids to text with a model's tokenizer.json", setup);

}  // namespace sala::cli
