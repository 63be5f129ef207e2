// Device sampling: one block per sampling sequence. See sampling.h for the
// rules; the host sampler (engine/runtime/sampler.cc) is the reference.
#include <cfloat>
#include <cmath>

#include "kernels/cuda/sampling.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

using simt::kFullMask;
using simt::kWarp;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kPenalised = 1;
constexpr int kSelected = 2;
constexpr int kListed = 4;
constexpr int kCounted = 8;
// A generated id's count, in the flags above their bits.
constexpr int kCountShift = 4;

int PaddedVocab(int vocab) {
  int p = 1;
  while (p < vocab) p *= 2;
  return p;
}

__host__ __device__ __forceinline__ size_t Align8(size_t bytes) { return (bytes + 7) / 8 * 8; }

// A logit as the host sampler's Finite (engine/runtime/sampler.cc) makes it:
// NaN the least likely of all, +-inf the largest finite magnitudes, so that
// no comparison or probability meets a NaN.
__device__ __forceinline__ float Finite(float v) {
  constexpr float kMax = 3.40282347e38f;
  if (v != v) return -kMax;
  return v > kMax ? kMax : (v < -kMax ? -kMax : v);
}

// Candidate order: higher score first, ties to the lower id; id < 0 is none.
__device__ __forceinline__ bool Better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

// The best (value, id) of the block; every thread passes its own and gets the
// block's. Every thread of the block calls it.
__device__ void BlockBest(float* value, int* id, float* shared_v, int* shared_i) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(kFullMask, *value, offset);
    const int oi = __shfl_xor_sync(kFullMask, *id, offset);
    if (Better(ov, oi, *value, *id)) {
      *value = ov;
      *id = oi;
    }
  }
  if (lane == 0) {
    shared_v[warp] = *value;
    shared_i[warp] = *id;
  }
  __syncthreads();
  if (warp == 0) {
    float v = lane < kWarps ? shared_v[lane] : 0.0f;
    int i = lane < kWarps ? shared_i[lane] : -1;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float ov = __shfl_xor_sync(kFullMask, v, offset);
      const int oi = __shfl_xor_sync(kFullMask, i, offset);
      if (Better(ov, oi, v, i)) {
        v = ov;
        i = oi;
      }
    }
    if (lane == 0) {
      shared_v[0] = v;
      shared_i[0] = i;
    }
  }
  __syncthreads();
  *value = shared_v[0];
  *id = shared_i[0];
  __syncthreads();
}

// Sums of v[0, N) over the block, each in a fixed tree (butterfly per
// warp, then the warps); shared holds N * kWarps doubles.
template <int N>
__device__ void BlockSums(double (&v)[N], double* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    for (int j = 0; j < N; ++j) v[j] += __shfl_xor_sync(kFullMask, v[j], offset);
  }
  if (lane == 0) {
    for (int j = 0; j < N; ++j) shared[j * kWarps + warp] = v[j];
  }
  __syncthreads();
  if (warp == 0) {
    for (int j = 0; j < N; ++j) {
      double w = lane < kWarps ? shared[j * kWarps + lane] : 0.0;
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        w += __shfl_xor_sync(kFullMask, w, offset);
      }
      if (lane == 0) shared[j * kWarps] = w;
    }
  }
  __syncthreads();
  for (int j = 0; j < N; ++j) v[j] = shared[j * kWarps];
  __syncthreads();
}

__device__ double BlockSum(double v, double* shared) {
  double sums[1] = {v};
  BlockSums(sums, shared);
  return sums[0];
}

// The smallest `index` any thread passes (n when none does).
__device__ int BlockMinIndex(int index, int* shared) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    index = min(index, __shfl_xor_sync(kFullMask, index, offset));
  }
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = index;
  __syncthreads();
  int best = shared[0];
  for (int w = 1; w < kWarps; ++w) best = min(best, shared[w]);
  __syncthreads();
  return best;
}

// Sum of values[0, n), each thread adding a contiguous chunk.
__device__ double ChunkedSum(const double* values, int n, double* shared) {
  const int chunk = (n + kThreads - 1) / kThreads;
  const int begin = min(n, static_cast<int>(threadIdx.x) * chunk);
  const int end = min(n, begin + chunk);
  double local = 0.0;
  for (int i = begin; i < end; ++i) local += values[i];
  return BlockSum(local, shared);
}

// The first i < n whose running sum of values[0..i] / divisor reaches the
// threshold (>= threshold, or > threshold when `strict`); n when none does.
// Running sums: each thread's contiguous chunk after the exclusive prefix of
// the chunks before it.
__device__ int FirstCumulative(const double* values, int n, double divisor, double threshold,
                               bool strict, double* prefix, int* shared_i) {
  const int chunk = (n + kThreads - 1) / kThreads;
  const int begin = min(n, static_cast<int>(threadIdx.x) * chunk);
  const int end = min(n, begin + chunk);
  double local = 0.0;
  for (int i = begin; i < end; ++i) local += values[i] / divisor;
  prefix[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    double running = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      const double here = prefix[t];
      prefix[t] = running;
      running += here;
    }
  }
  __syncthreads();
  double running = prefix[threadIdx.x];
  int found = n;
  for (int i = begin; i < end; ++i) {
    running += values[i] / divisor;
    if (strict ? threshold < running : running >= threshold) {
      found = i;
      break;
    }
  }
  __syncthreads();  // prefix[] is free again
  return BlockMinIndex(found, shared_i);
}

// A score's place in the candidate order as an unsigned key, ascending with
// the score (-0 as +0, as they tie): a higher key is a likelier candidate.
__device__ __forceinline__ unsigned AscendingKey(float score) {
  const unsigned bits = __float_as_uint(score == 0.0f ? 0.0f : score);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// A candidate's weight beside the best score `top` (the host's rule: 0 for
// the lowest finite score below a higher best, at any temperature).
__device__ __forceinline__ double Weight(float score, double top, double inv_t) {
  return score == -FLT_MAX && top > -FLT_MAX ? 0.0
                                             : exp((static_cast<double>(score) - top) * inv_t);
}

// Sorts keys/ids[0, n) (n a power of two) best first (Better), block-wide.
__device__ void BitonicSort(float* keys, int* ids, int n) {
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int other = i ^ stride;
        if (other <= i) continue;
        const bool best_first = (i & size) == 0;
        const bool swap = best_first ? Better(keys[other], ids[other], keys[i], ids[i])
                                     : Better(keys[i], ids[i], keys[other], ids[other]);
        if (swap) {
          const float kv = keys[i];
          keys[i] = keys[other];
          keys[other] = kv;
          const int iv = ids[i];
          ids[i] = ids[other];
          ids[other] = iv;
        }
      }
      __syncthreads();
    }
  }
}

// The candidates most likely first in keys/ids[0, n), n returned: the
// shortest prefix of the whole order (with every candidate tied with its
// last) that holds at least `min_count` candidates, weighs at least `need`
// (`weights`: each id's, in id order) and has no key past `max_key`, found
// by bisecting the key of its last candidate (one pass over the
// vocabulary a step, 32 at most); then only the prefix is sorted. A draw
// reads a prefix of the order, usually a short one: sorting the whole
// vocabulary took 120 block-wide passes over it at 32,000 ids.
__device__ int SortedPrefix(const float* scores, const double* weights, int vocab, int min_count,
                            double need, unsigned max_key, float* keys, int* ids, double* shared_d,
                            int* counter) {
  const int tid = threadIdx.x;
  // Every candidate's key is at least 0: lo always qualifies; hi never.
  unsigned long long lo = 0, hi = static_cast<unsigned long long>(max_key) + 1;
  while (hi - lo > 1) {
    const unsigned long long mid = lo + (hi - lo) / 2;
    double count_mass[2] = {0.0, 0.0};
    for (int i = tid; i < vocab; i += kThreads) {
      if (AscendingKey(scores[i]) >= mid) {
        count_mass[0] += 1.0;
        count_mass[1] += weights[i];
      }
    }
    BlockSums(count_mass, shared_d);
    if (count_mass[0] >= min_count && count_mass[1] >= need) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (tid == 0) *counter = 0;
  __syncthreads();
  // Gathered in any order: the sort below puts them in the one order.
  for (int i = tid; i < vocab; i += kThreads) {
    if (AscendingKey(scores[i]) >= lo) {
      const int at = atomicAdd(counter, 1);
      keys[at] = scores[i];
      ids[at] = i;
    }
  }
  __syncthreads();
  const int n = *counter;
  int padded = 1;
  while (padded < n) padded *= 2;
  for (int i = n + tid; i < padded; i += kThreads) {
    keys[i] = -INFINITY;
    ids[i] = -1;
  }
  __syncthreads();
  BitonicSort(keys, ids, padded);
  return n;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* logits, int64_t logits_ld, int vocab, int padded,
                 const DeviceSampleParams* params, const int32_t* history, char* scratch,
                 int64_t scratch_stride, int max_logprobs, int32_t* token_out, float* logprob_out,
                 int32_t* top_ids, float* top_logprobs) {
  SIMT_GRID_WAIT();
  SIMT_SHARED(float, red_v, kWarps);
  SIMT_SHARED(int, red_i, kWarps);
  SIMT_SHARED(double, red_d, kWarps);
  SIMT_SHARED(double, prefix, kThreads);
  SIMT_SHARED(double, red_d2, 2 * kWarps);
  SIMT_SHARED(unsigned, red_u, 1);
  SIMT_SHARED(int, red_i2, 1);
  const int64_t sample = blockIdx.x;
  const DeviceSampleParams p = params[sample];
  const float* row = logits + static_cast<int64_t>(p.logits_row) * logits_ld;
  char* base = scratch + sample * scratch_stride;
  float* scores = reinterpret_cast<float*>(base);
  int* flags = reinterpret_cast<int*>(base + Align8(4 * static_cast<size_t>(vocab)));
  float* keys = reinterpret_cast<float*>(reinterpret_cast<char*>(flags) +
                                         Align8(4 * static_cast<size_t>(vocab)));
  int* ids = reinterpret_cast<int*>(reinterpret_cast<char*>(keys) +
                                    Align8(4 * static_cast<size_t>(padded)));
  double* probs = reinterpret_cast<double*>(reinterpret_cast<char*>(ids) +
                                            Align8(4 * static_cast<size_t>(padded)));
  const int tid = threadIdx.x;

  const bool restricted = p.allowed_end > p.allowed_begin;
  for (int i = tid; i < vocab; i += kThreads) {
    scores[i] = restricted ? -FLT_MAX : Finite(row[i]);
    flags[i] = 0;
  }
  __syncthreads();
  if (restricted) {
    for (int a = p.allowed_begin + tid; a < p.allowed_end; a += kThreads) {
      const int id = history[a];
      if (id >= 0 && id < vocab) scores[id] = Finite(row[id]);
    }
    __syncthreads();
  }
  for (int b = p.bias_begin + 2 * tid; b + 1 < p.bias_end; b += 2 * kThreads) {
    const int id = history[b];
    if (id >= 0 && id < vocab) scores[id] = Finite(scores[id] + __int_as_float(history[b + 1]));
  }
  __syncthreads();
  if (p.repetition_penalty != 1.0f) {
    for (int h = p.history_begin + tid; h < p.history_end; h += kThreads) {
      const int id = history[h];
      if (id < 0 || id >= vocab) continue;
      // Each distinct id once, whichever thread claims it.
      if ((atomicOr(&flags[id], kPenalised) & kPenalised) != 0) continue;
      const float s = scores[id];
      // The lowest score stays the lowest, as on the host.
      if (s == -FLT_MAX) continue;
      scores[id] = Finite(s > 0 ? s / p.repetition_penalty : s * p.repetition_penalty);
    }
  }
  __syncthreads();
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (int h = p.generated_begin + tid; h < p.history_end; h += kThreads) {
      const int id = history[h];
      if (id >= 0 && id < vocab) atomicAdd(&flags[id], 1 << kCountShift);
    }
    __syncthreads();
    for (int h = p.generated_begin + tid; h < p.history_end; h += kThreads) {
      const int id = history[h];
      if (id < 0 || id >= vocab) continue;
      const int before = atomicOr(&flags[id], kCounted);
      if ((before & kCounted) != 0) continue;  // each distinct id once
      const float count = static_cast<float>(before >> kCountShift);
      const float penalty = __fmaf_rn(p.frequency_penalty, count, p.presence_penalty);
      scores[id] = Finite(scores[id] - penalty);
    }
    __syncthreads();
  }

  // log-softmax normaliser of the raw logits (made finite).
  float top_logit = -INFINITY;
  int top_id = -1;
  for (int i = tid; i < vocab; i += kThreads) {
    const float logit = Finite(row[i]);
    if (Better(logit, i, top_logit, top_id)) {
      top_logit = logit;
      top_id = i;
    }
  }
  BlockBest(&top_logit, &top_id, red_v, red_i);
  double exp_sum = 0.0;
  for (int i = tid; i < vocab; i += kThreads)
    exp_sum += exp(static_cast<double>(Finite(row[i]) - top_logit));
  exp_sum = BlockSum(exp_sum, red_d);
  // (x - max) - log(sum), as the CPU sampler: exact for likely tokens.
  const float log_sum = static_cast<float>(log(exp_sum));

  int chosen;
  if (p.temperature == 0.0f) {
    float best = -INFINITY;
    chosen = -1;
    for (int i = tid; i < vocab; i += kThreads) {
      if (Better(scores[i], i, best, chosen)) {
        best = scores[i];
        chosen = i;
      }
    }
    BlockBest(&best, &chosen, red_v, red_i);
  } else {
    int keep = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
    const int before_cuts = keep;
    const double inv_t = 1.0 / p.temperature;
    int sorted;  // keys/ids[0, sorted): the first candidates in order
    double total = 0.0;
    bool have_total = false;
    if (keep <= kSelectMax) {
      // The best `keep` candidates in order, one block argmax each.
      for (int r = 0; r < keep; ++r) {
        float best = -INFINITY;
        int id = -1;
        for (int i = tid; i < vocab; i += kThreads) {
          if ((flags[i] & kSelected) == 0 && Better(scores[i], i, best, id)) {
            best = scores[i];
            id = i;
          }
        }
        BlockBest(&best, &id, red_v, red_i);
        if (tid == 0) {
          keys[r] = best;
          ids[r] = id;
          flags[id] |= kSelected;
        }
        __syncthreads();
      }
      sorted = keep;
    } else {
      // Sorted only as far as the cuts and the draw read: the top_k
      // candidates; or, with every candidate kept, the top_p mass (or the
      // draw's u * total) and every candidate min_p keeps.
      float top = -INFINITY;
      int best_id = -1;
      for (int i = tid; i < vocab; i += kThreads) {
        if (Better(scores[i], i, top, best_id)) {
          top = scores[i];
          best_id = i;
        }
      }
      BlockBest(&top, &best_id, red_v, red_i);
      // Each id's weight, in id order, in probs until the prefix is sorted.
      for (int i = tid; i < vocab; i += kThreads) probs[i] = Weight(scores[i], top, inv_t);
      __syncthreads();
      int min_count = 1;
      double need = 0.0;
      if (keep < vocab) {
        min_count = keep;
      } else {
        // As the host: every id's weight summed in id order.
        total = ChunkedSum(probs, vocab, red_d);
        have_total = true;
        // A margin past the sums' rounding, which differs between the
        // bisection's and the walks' orders.
        need = (p.top_p < 1.0f ? p.top_p : p.uniform) * total * (1.0 + 1e-9);
      }
      unsigned max_key = 0xFFFFFFFFu;
      if (p.min_p > 0.0f) {
        // The best weighs 1: every candidate of weight min_p or more.
        unsigned lowest = 0xFFFFFFFFu;
        for (int i = tid; i < vocab; i += kThreads) {
          if (probs[i] >= static_cast<double>(p.min_p))
            lowest = min(lowest, AscendingKey(scores[i]));
        }
        if (tid == 0) red_u[0] = 0xFFFFFFFFu;
        __syncthreads();
        atomicMin(&red_u[0], lowest);
        __syncthreads();
        max_key = red_u[0];
        __syncthreads();
      }
      sorted = SortedPrefix(scores, probs, vocab, min_count, need, max_key, keys, ids, red_d2,
                            &red_i2[0]);
    }
    // A prefix shorter than `keep` holds everything the cuts and the draw
    // read (up to the sums' last bits).
    const int avail = min(keep, sorted);
    const double best = keys[0];
    for (int i = tid; i < avail; i += kThreads) {
      // The lowest finite score has no chance beside a higher one (the
      // host's Excluded), at any temperature.
      probs[i] = Weight(keys[i], best, inv_t);
    }
    __syncthreads();
    if (!have_total) total = ChunkedSum(probs, avail, red_d);
    if (p.top_p < 1.0f) {
      const int at = FirstCumulative(probs, avail, total, p.top_p, false, prefix, red_i);
      keep = at < avail ? at + 1 : avail;
    }
    if (p.min_p > 0.0f) {
      const double threshold = p.min_p * probs[0];
      const int end = min(keep, avail);
      int below = end;
      for (int i = 1 + tid; i < end; i += kThreads) {
        if (probs[i] < threshold) {
          below = i;
          break;
        }
      }
      keep = BlockMinIndex(below, red_i);
    }
    if (keep < before_cuts) total = ChunkedSum(probs, keep, red_d);
    const int end = min(keep, avail);
    const int at = FirstCumulative(probs, end, 1.0, p.uniform * total, true, prefix, red_i);
    chosen = ids[at < end ? at : end - 1];
  }

  if (tid == 0) {
    token_out[sample] = chosen;
    logprob_out[sample] = (Finite(row[chosen]) - top_logit) - log_sum;
  }
  // The n most likely tokens of the raw logits.
  const int n = min(p.n_logprobs, min(vocab, max_logprobs));
  for (int r = 0; r < n; ++r) {
    float best = -INFINITY;
    int id = -1;
    for (int i = tid; i < vocab; i += kThreads) {
      const float logit = Finite(row[i]);
      if ((flags[i] & kListed) == 0 && Better(logit, i, best, id)) {
        best = logit;
        id = i;
      }
    }
    BlockBest(&best, &id, red_v, red_i);
    if (tid == 0) {
      top_ids[sample * max_logprobs + r] = id;
      top_logprobs[sample * max_logprobs + r] = (Finite(row[id]) - top_logit) - log_sum;
      flags[id] |= kListed;
    }
    __syncthreads();
  }
}

}  // namespace

size_t SamplingScratchBytes(int vocab) {
  const size_t v = static_cast<size_t>(vocab);
  const size_t padded = static_cast<size_t>(PaddedVocab(vocab));
  return 2 * Align8(4 * v) + 2 * Align8(4 * padded) + 8 * padded;
}

cudaError_t LaunchSampling(const SamplingArgs& a, cudaStream_t stream) {
  if (a.vocab < 1 || a.max_logprobs < 0) return cudaErrorInvalidValue;
  if (a.samples == 0) return cudaSuccess;
  return SIMT_LAUNCH_DEPENDENT(SampleKernel, dim3(a.samples), dim3(kThreads), 0, stream, a.logits,
                               a.logits_ld, a.vocab, PaddedVocab(a.vocab), a.params, a.history,
                               static_cast<char*>(a.scratch),
                               static_cast<int64_t>(SamplingScratchBytes(a.vocab)), a.max_logprobs,
                               a.token, a.logprob, a.top_ids, a.top_logprobs);
}

}  // namespace switchserve::cuda
