// The next token of each sampling sequence, picked on the device from its
// logits row by the host sampler's rules (engine/runtime/sampler.h): the
// allowed ids, logit bias, repetition penalty over the history (each distinct id once),
// presence and frequency penalties over its generated part (one fused
// multiply-add per distinct id, as the host computes it), then greedy
// argmax (temperature 0; ties to the lower id) or: candidates ordered by
// penalised score (ties to the lower id), cut to top_k, to the top_p mass and
// to min_p of the best, weights exp((s - best) / temperature) in double (0
// for the lowest finite score below a higher best), and
// the first candidate whose running weight exceeds u * total. The logprob of
// the token and the n most likely alternatives are log-softmax of the raw
// logits.
//
// u is the request's own uniform draw, made on the host from its generator
// (one draw per non-greedy token, as the host sampler draws) and uploaded
// with the step, so generator state never lives on the device. The double
// sums here are block reductions in a fixed order rather than the host's
// left-to-right loops (each thread a contiguous run of candidates once more
// than kThreads are kept), so a running sum can differ from the host's in its
// last bits: the two pick the same token unless u * total, or top_p, lies
// within a few ulps of a cumulative boundary. Exactly tied candidates can put
// top_p on one: 300 equal logits with top_p 0.5 are cut after 150 candidates
// on the host and 151 here.
//
// The candidate order comes from repeated block argmax when at most
// kSelectMax candidates are kept (top_k). Otherwise only the prefix of the
// order that the cuts and the draw read is sorted (block-wide bitonic, in
// scratch memory): the top_k candidates, or, with every candidate kept, those
// that weigh the top_p mass (top_p 1: the draw's u * total, with a margin of
// 1e-9 of it) and every one min_p keeps, with all tied with the last; the
// key of the prefix's last candidate found by bisection, a block reduction
// over the vocabulary per step. Without a top_k cut the total weight is
// summed over the vocabulary in id order, as the host sums it.
#ifndef SWITCHSERVE_KERNELS_CUDA_SAMPLING_H_
#define SWITCHSERVE_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace switchserve::cuda {

// One sampling sequence's parameters, as uploaded (plain data).
struct DeviceSampleParams {
  double uniform = 0;  // the request's draw in [0, 1); unused when greedy
  float temperature = 0;
  float top_p = 1;
  float min_p = 0;
  float repetition_penalty = 1;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  int32_t logits_row = 0;  // row of `logits`
  int32_t top_k = 0;
  int32_t n_logprobs = 0;  // <= SamplingArgs::max_logprobs
  // history[history_begin, history_end): the sequence's ids (the repetition
  // penalty's); from generated_begin on, the generated ones (the presence and
  // frequency penalties').
  int32_t history_begin = 0;
  int32_t history_end = 0;
  int32_t generated_begin = 0;
  // history[bias_begin, bias_end): the logit bias as pairs (token id, the
  // bits of its float bias), distinct ids.
  int32_t bias_begin = 0;
  int32_t bias_end = 0;
  // history[allowed_begin, allowed_end): the ids that may be sampled,
  // distinct; empty: every id (the others' scores are the lowest finite).
  int32_t allowed_begin = 0;
  int32_t allowed_end = 0;
};

inline constexpr int kSelectMax = 64;

// Scratch bytes one sample needs for a vocabulary of `vocab`.
size_t SamplingScratchBytes(int vocab);

struct SamplingArgs {
  const float* logits = nullptr;  // [rows, vocab], rows logits_ld floats apart
  int64_t logits_ld = 0;
  int vocab = 0;
  const DeviceSampleParams* params = nullptr;  // [samples]
  int samples = 0;
  const int32_t* history = nullptr;  // DeviceSampleParams' ids and biases
  void* scratch = nullptr;           // samples * SamplingScratchBytes(vocab) bytes
  int max_logprobs = 0;
  // Outputs: [samples], and [samples, max_logprobs] (the first n_logprobs used).
  int32_t* token = nullptr;
  float* logprob = nullptr;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
};

cudaError_t LaunchSampling(const SamplingArgs& args, cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_SAMPLING_H_
