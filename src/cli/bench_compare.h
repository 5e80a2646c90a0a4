// `sala bench --random PRESET --compare bf16,fp8+lm,int4/g128+lm`: batch-1 prefill and decode of
// one random model shape in several weight formats on one device, in interleaved rounds (every
// format once per round, so that drift of the machine falls on all of them alike), each against
// the first — the table of issue #8's targets (docs/quantization.md) in one command.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace sala::cli {

// FORMAT[/gN][+lm][+w8a8]: FORMAT bf16 (or none), fp8, int8, int4; /gN columns per scale group
// (int4: 32, 64 default, 128, 256; int8 in groups: the MLX 8-bit layout); +lm the lm_head packed
// too; +w8a8 prompt products with quantized activations (fp8: --fp8-prefill, int8/int4:
// --int8-prefill).
struct FormatSpec {
  std::string text;  // as given
  RandomQuant quant;
  bool w8a8 = false;
  // "fp8 + lm_head", "int4 g128 + lm_head, W8A8 prefill"; dense: `dense`, the backend's weight dtype.
  std::string label(const std::string& dense) const;
};
FormatSpec parse_format_spec(const std::string& text);

struct CompareOptions {
  std::string preset;               // random weights of this preset (model/presets.h)
  std::vector<FormatSpec> formats;  // the first is the reference of the × column
  std::vector<int64_t> contexts;    // batch-1 rows at each (ascending)
  int64_t chunk = 4096;             // prefill tokens per forward
  int steps = 32;                   // timed decode steps per row (after 2 warm-ups)
  int rounds = 2;
  uint64_t seed = 0;
  std::string json;                 // write the rows here (if not empty)
};
// Runs the rounds (one model alive at a time), prints progress to stderr and the table to stdout.
int run_format_comparison(Backend& backend, const CompareOptions& o);

}  // namespace sala::cli
