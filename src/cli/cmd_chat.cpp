// sala chat [MODEL]: interactive multi-turn chat. The whole history is re-encoded each turn
// (simple, and exact: the cache starts empty every time). `clear` resets, `quit`/`exit` or EOF
// leave; Ctrl-C stops the current answer, and at the prompt it leaves. Scripted input (stdin not
// a terminal) gets the answers only, one after another, each ending with a newline.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/generation.h"
#include "core/error.h"

namespace sala::cli {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted.store(true); }

// SA_RESTART keeps stdio writes and the worker threads' waits unaffected; the prompt notices
// Ctrl-C through poll(), which a handled signal always interrupts.
void install_sigint_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
}

// Lines from fd 0 without stdio, so that Ctrl-C while waiting for input is seen at once.
class LineReader {
 public:
  enum class Result { Line, Eof, Interrupted };

  Result read(std::string& line) {
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Result::Line;
      }
      if (eof_) {
        if (buf_.empty()) return Result::Eof;
        line = std::move(buf_);  // a last line without a newline
        buf_.clear();
        return Result::Line;
      }
      if (g_interrupted.load()) return Result::Interrupted;
      pollfd p{0, POLLIN, 0};
      if (::poll(&p, 1, -1) < 0) {
        if (errno == EINTR) continue;
        fail("chat: cannot wait for input: {}", std::strerror(errno));
      }
      char chunk[4096];
      const ssize_t n = ::read(0, chunk, sizeof chunk);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("chat: cannot read input: {}", std::strerror(errno));
      }
      if (n == 0) eof_ = true;
      else buf_.append(chunk, size_t(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

void write_out(std::string_view s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

bool is_command(const std::string& line, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (line == n || line == std::string("/") + n) return true;
  return false;
}

Runner setup(CLI::App& app) {
  struct Opts {
    std::string model;
    SamplingOptions sampling;
    SpeculativeCliOptions speculative;
    PromptOptions prompt_opts;
    BackendOptions backend;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("MODEL", o->model, "model directory; omit it (or say 'default') for the built-in random model");
  o->prompt_opts.add(app, /*allow_raw=*/false);
  o->sampling.add(app);
  o->speculative.add(app);
  o->backend.add(app);
  app.footer("In the chat: 'clear' starts a new conversation, 'quit' or 'exit' (or Ctrl-D) leaves, Ctrl-C stops an "
             "answer (and leaves when pressed at the prompt).");
  return [o] {
    auto s = open_session(resolve_model_ref(o->model), o->backend, o->sampling, 1, /*chat=*/true, &o->speculative);
    const bool tty = ::isatty(0) != 0;
    const int64_t ctx = s->engine->options().max_context;
    if (tty)
      std::fprintf(stderr,
                   "chat: type a message. 'clear' resets the conversation, 'quit' or Ctrl-D leaves, Ctrl-C stops an "
                   "answer.\n");
    install_sigint_handler();

    std::vector<ChatMessage> history;
    LineReader reader;
    SamplingParams params = o->sampling.resolved();
    int64_t answers = 0;
    for (uint64_t turn = 0;; ++turn) {
      g_interrupted.store(false);
      if (tty) write_out("> ");
      std::string line;
      const auto got = reader.read(line);
      if (got != LineReader::Result::Line) {
        if (tty) write_out("\n");
        break;
      }
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      if (is_command(line, {"quit", "exit"})) break;
      if (is_command(line, {"clear"})) {
        history.clear();
        if (tty) std::fprintf(stderr, "(conversation cleared)\n");
        continue;
      }

      history.push_back({"user", line});
      std::vector<int32_t> ids = o->prompt_opts.encode(s->tokenizer, history);
      // Too long for the context: forget the oldest exchanges, keeping at least this message.
      while (int64_t(ids.size()) + 1 >= ctx && history.size() > 1) {
        history.erase(history.begin(), history.begin() + std::min<std::ptrdiff_t>(2, std::ptrdiff_t(history.size()) - 1));
        std::fprintf(stderr, "note: the conversation no longer fits --ctx-size %lld; dropped the oldest turn\n",
                     (long long)ctx);
        ids = o->prompt_opts.encode(s->tokenizer, history);
      }
      if (int64_t(ids.size()) + 1 >= ctx) {
        std::fprintf(stderr, "error: this message (%zu tokens) does not fit --ctx-size %lld\n", ids.size(),
                     (long long)ctx);
        history.pop_back();
        continue;
      }

      TextStream text(s->tokenizer, o->prompt_opts.text_options(o->sampling.stop));
      GenerationRequest req;
      req.prompt = std::move(ids);
      req.sampling = params;
      req.sampling.seed = params.seed + turn;  // a fresh draw each turn, reproducible with --seed
      req.max_tokens = o->sampling.max_tokens;
      req.ignore_eos = o->sampling.ignore_eos;
      bool stopped_by_user = false;
      req.on_token = [&](const SampledToken& t) {
        if (g_interrupted.load()) {
          stopped_by_user = true;
          return false;
        }
        write_out(text.push(t.id));
        return !text.stopped();
      };
      s->scheduler->submit(std::move(req));
      s->scheduler->run();
      ++answers;
      if (!stopped_by_user) write_out(text.finish());
      write_out(tty ? "\n\n" : "\n");
      if (stopped_by_user) std::fprintf(stderr, "(answer stopped)\n");
      history.push_back({"assistant", text.text()});
    }
    print_timing(*s->scheduler, answers);
    return 0;
  };
}

}  // namespace
SALA_COMMAND(chat, "Interactive multi-turn chat", setup);
}  // namespace sala::cli
