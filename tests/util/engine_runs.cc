#include "tests/util/engine_runs.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>

#include "engine/runtime/generation_engine.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"

namespace switchserve::testing {
namespace {

class OutcomeSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (GeneratedTokenInfo& token : update.tokens) outcome_.tokens.push_back(std::move(token));
    for (GeneratedTokenInfo& token : update.prompt_logprobs) {
      outcome_.prompt_logprobs.push_back(std::move(token));
    }
    if (update.finished) {
      outcome_.status = update.status;
      outcome_.finish_reason = update.finish_reason;
      outcome_.cached_prompt_tokens = update.cached_prompt_tokens;
      done_ = true;
      cv_.notify_all();
    }
  }
  RequestOutcome Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return outcome_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  RequestOutcome outcome_;
};

class TotalsObserver : public EngineObserver {
 public:
  explicit TotalsObserver(EngineRunTotals* totals) : totals_(totals) {}
  void OnStep(const StepReport& report) override {
    ++totals_->steps;
    totals_->preemptions += report.preempted;
    totals_->prefill_tokens += report.prefill_tokens;
    totals_->prefix_query_tokens += report.prefix_query_tokens;
    totals_->prefix_hit_tokens += report.prefix_hit_tokens;
    totals_->max_sequences_per_step =
        std::max(totals_->max_sequences_per_step, report.num_sequences);
    if (report.routing == nullptr) return;
    for (const RouterStepStats& router : report.routing->routers) {
      for (int64_t n : router.dropped) totals_->dropped += n;
      for (int64_t n : router.rerouted) totals_->rerouted += n;
    }
  }

 private:
  EngineRunTotals* totals_;
};

}  // namespace

std::vector<RequestOutcome> RunEngine(const BackendUnderTest& backend, const Model& model,
                                      const EngineRunConfig& config,
                                      const std::vector<TestRequest>& requests,
                                      EngineRunTotals* totals) {
  std::unique_ptr<Backend> engine_backend =
      backend.create(model.config, model.weights, config.dispatch);
  KvCacheOptions cache;
  cache.block_size = config.block_size;
  cache.max_tokens = config.kv_cache_tokens;
  cache.prefix_caching = config.prefix_caching;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(engine_backend.get(), cache);
  EXPECT_TRUE(kv_cache.ok()) << kv_cache.status();
  if (!kv_cache.ok()) return {};
  EngineOptions options;
  options.dispatch = config.dispatch;
  options.scheduler.max_batch_tokens = config.max_batch_tokens;
  options.scheduler.max_running_requests = config.max_running_requests;
  options.context_length = model.config.max_seq_len;
  options.eos_token_id = model.config.eos_token_id;
  EngineRunTotals local;
  TotalsObserver observer(totals != nullptr ? totals : &local);
  GenerationEngine engine(options, engine_backend.get(), kv_cache->get(), model.tokenizer.get(),
                          &observer);
  std::vector<std::shared_ptr<OutcomeSink>> sinks;
  for (const TestRequest& r : requests) {
    GenerationRequest request;
    request.prompt = r.prompt;
    request.sampling = r.sampling;
    request.sink = sinks.emplace_back(std::make_shared<OutcomeSink>());
    absl::StatusOr<RequestId> id = engine.Submit(std::move(request));
    EXPECT_TRUE(id.ok()) << id.status();
  }
  engine.Start();
  std::vector<RequestOutcome> outcomes;
  for (const auto& sink : sinks) outcomes.push_back(sink->Wait());
  engine.Stop();
  return outcomes;
}

std::vector<float> FullPassLogits(const BackendUnderTest& backend, const Model& model,
                                  const DispatchConfig& dispatch,
                                  const std::vector<int32_t>& tokens) {
  std::unique_ptr<Backend> runner_backend = backend.create(model.config, model.weights, dispatch);
  absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
      SequenceRunner::Create(runner_backend.get(), model.config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  absl::StatusOr<std::vector<float>> logits = (*runner)->Append(0, tokens, /*all_logits=*/true);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *std::move(logits) : std::vector<float>();
}

std::vector<TokenRouting> PromptRouting(const BackendUnderTest& backend, const Model& model,
                                        const DispatchConfig& dispatch,
                                        const std::vector<int32_t>& tokens) {
  std::unique_ptr<Backend> step_backend = backend.create(model.config, model.weights, dispatch);
  KvCacheOptions cache;
  cache.max_tokens = static_cast<int64_t>(tokens.size());
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(step_backend.get(), cache);
  EXPECT_TRUE(kv_cache.ok()) << kv_cache.status();
  if (!kv_cache.ok()) return {};
  KvBlockAllocator& allocator = (*kv_cache)->allocator();
  EXPECT_TRUE(allocator.Reserve(0, static_cast<int64_t>(tokens.size())).ok());
  StepBatch batch;
  batch.Clear(allocator.block_size());
  StepSequence& sequence = batch.Add(tokens, 0, allocator.BlockTable(0));
  sequence.logits = LogitsMode::kAll;
  sequence.collect_routing = true;
  StepOutput out;
  const absl::Status status = step_backend->Forward(batch, &out);
  EXPECT_TRUE(status.ok()) << status;
  return out.routing;
}

FateCounts CountFates(const std::vector<GeneratedTokenInfo>& tokens) {
  FateCounts counts;
  for (const GeneratedTokenInfo& token : tokens) {
    for (const RouteChoice& choice : token.routing.choices) {
      switch (choice.fate) {
        case RouteFate::kKept:
          ++counts.kept;
          break;
        case RouteFate::kRerouted:
          ++counts.rerouted;
          break;
        case RouteFate::kDropped:
          ++counts.dropped;
          break;
      }
    }
  }
  return counts;
}

std::vector<int32_t> ByteTokens(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

const Model& DefaultModel() {
  static const Model* const model = [] {
    absl::StatusOr<std::unique_ptr<Model>> loaded = LoadModel(SourcePath("models/default"));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? loaded->release() : nullptr;
  }();
  return *model;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

std::string FirstDifference(const std::vector<GeneratedTokenInfo>& a,
                            const std::vector<GeneratedTokenInfo>& b) {
  if (a.size() != b.size()) {
    return "lengths " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const GeneratedTokenInfo& x = a[i];
    const GeneratedTokenInfo& y = b[i];
    const std::string where = "token " + std::to_string(i) + ": ";
    if (x.token_id != y.token_id) return where + "id";
    if (Bits(x.logprob) != Bits(y.logprob)) return where + "logprob";
    if (x.top_logprobs.size() != y.top_logprobs.size()) return where + "alternatives";
    for (size_t j = 0; j < x.top_logprobs.size(); ++j) {
      if (x.top_logprobs[j].first != y.top_logprobs[j].first ||
          Bits(x.top_logprobs[j].second) != Bits(y.top_logprobs[j].second)) {
        return where + "alternative " + std::to_string(j);
      }
    }
    if (x.routing.choices.size() != y.routing.choices.size()) return where + "routing size";
    for (size_t j = 0; j < x.routing.choices.size(); ++j) {
      const RouteChoice& p = x.routing.choices[j];
      const RouteChoice& q = y.routing.choices[j];
      if (p.expert != q.expert || p.fate != q.fate || Bits(p.gate) != Bits(q.gate)) {
        return where + "routing choice " + std::to_string(j);
      }
    }
  }
  return "";
}

std::string FirstDifference(const RequestOutcome& a, const RequestOutcome& b) {
  const std::string generated = FirstDifference(a.tokens, b.tokens);
  if (!generated.empty()) return generated;
  const std::string prompt = FirstDifference(a.prompt_logprobs, b.prompt_logprobs);
  return prompt.empty() ? "" : "prompt " + prompt;
}

TestRequest GreedyRoutedRequest(const std::string& text, int max_new_tokens) {
  TestRequest request;
  request.prompt = ByteTokens(text);
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = max_new_tokens;
  request.sampling.ignore_eos = true;
  request.sampling.logprobs = 1;
  request.sampling.return_routing = true;
  return request;
}

}  // namespace switchserve::testing
