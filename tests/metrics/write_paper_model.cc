// Writes a model directory with the routing shape of the SwitchHead paper's
// SwitchAll model (18 layers; SwitchHead H = 4 heads, own router each, E = 4,
// k = 2; MoE FFN 32 experts, k = 4, sigmoid) and random weights, at a width
// chosen on the command line, for measuring what the metrics cost
// (tests/metrics/measure_overhead.py, docs/performance.md). Narrow widths make
// steps cheap and so the metrics' share of a step as large as it gets.
//
//   switchserve_metrics_paper_model OUT_DIR [d_model head_dim d_ff]
#include <cstdio>
#include <cstdlib>

#include "engine/model/model_loader.h"
#include "tests/util/random_model.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    std::fprintf(stderr, "usage: %s OUT_DIR [d_model head_dim d_ff]\n", argv[0]);
    return 2;
  }
  using namespace switchserve;
  // The paper's routing shape (layers, heads, experts, k) with narrower
  // widths by default: cheap steps make the metrics' share of a step largest.
  ModelConfig config = testing::PaperSwitchAllConfig();
  config.name = "paper-shape-switchall";
  config.vocab_size = 256;
  config.tokenizer = TokenizerKind::kByte;
  config.max_seq_len = 512;
  config.d_model = argc == 5 ? std::atoi(argv[2]) : 256;
  config.attention.head_dim = argc == 5 ? std::atoi(argv[3]) : 64;
  config.ffn.d_ff = argc == 5 ? std::atoi(argv[4]) : 64;
  const ModelWeights weights = testing::RandomWeights(config, /*seed=*/262);
  if (absl::Status status = WriteModelDirectory(argv[1], config, weights, DType::kF32);
      !status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
