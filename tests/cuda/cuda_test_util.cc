#include "tests/cuda/cuda_test_util.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace switchserve::testing {
namespace {

template <typename T>
void Append(const T& value, std::string* out) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

BackendUnderTest CudaBackendWith(const CudaBackendOptions& options, const std::string& name) {
  return {name,
          [options](const ModelConfig& config, const ModelWeights& weights,
                    const DispatchConfig& dispatch) -> std::unique_ptr<Backend> {
            auto backend = CreateCudaBackend(config, weights, dispatch, options);
            if (!backend.ok()) {
              ADD_FAILURE() << "cannot create the CUDA backend: " << backend.status();
              return nullptr;
            }
            return *std::move(backend);
          }};
}

CudaBackendOptions CudaF32Options() {
  CudaBackendOptions options;
  options.sixteen_bit_weights = false;
  options.attention_segment_tokens = 16;
  return options;
}

CudaBackendOptions Cuda16BitOptions() {
  CudaBackendOptions options;
  options.attention_segment_tokens = 16;
  return options;
}

BackendUnderTest CpuBackend() {
  return {"cpu",
          [](const ModelConfig& config, const ModelWeights& weights,
             const DispatchConfig& dispatch) -> std::unique_ptr<Backend> {
            auto backend = CreateCpuBackend(config, weights, dispatch);
            if (!backend.ok()) {
              ADD_FAILURE() << "cannot create the CPU backend: " << backend.status();
              return nullptr;
            }
            return *std::move(backend);
          }};
}

std::string OutputBytes(const StepOutput& out) {
  std::string bytes = FloatBytes(out.logits, 0, out.logits.size());
  for (int32_t v : out.row_sequence) Append(v, &bytes);
  for (int32_t v : out.row_position) Append(v, &bytes);
  auto routing = [&](const TokenRouting& r) {
    for (const RouteChoice& c : r.choices) {
      Append(c.expert, &bytes);
      Append(c.gate, &bytes);
      Append(c.fate, &bytes);
    }
  };
  for (const SampledToken& s : out.samples) {
    Append(s.sequence, &bytes);
    Append(s.sample.token_id, &bytes);
    Append(s.sample.logprob, &bytes);
    for (const auto& [id, logprob] : s.sample.top_logprobs) {
      Append(id, &bytes);
      Append(logprob, &bytes);
    }
    routing(s.routing);
  }
  for (const TokenRouting& r : out.routing) routing(r);
  for (const RouterStepStats& s : out.stats.routers) {
    Append(s.tokens, &bytes);
    for (size_t e = 0; e < s.routed.size(); ++e) {
      Append(s.routed[e], &bytes);
      Append(s.kept[e], &bytes);
      Append(s.rerouted[e], &bytes);
      Append(s.dropped[e], &bytes);
      Append(s.prob_sum[e], &bytes);
    }
  }
  return bytes;
}

std::string FloatBytes(const std::vector<float>& v, size_t first, size_t n) {
  EXPECT_LE(first + n, v.size());
  return std::string(reinterpret_cast<const char*>(v.data() + first), n * sizeof(float));
}

double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace switchserve::testing
