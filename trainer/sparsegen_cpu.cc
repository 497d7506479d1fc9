// sparsegen-lin for training on the CPU: the forward and the backward of bertzoo::sparsegen_lin, each one pass per
// row over memory (trainer/sparsegen_native.py loads this with ctypes; no torch headers, a plain C ABI).
//
// Eager PyTorch makes a dozen passes over the [batch, heads, queries, keys] scores per layer (masking, scaling, the
// row max, each bisection step, each Michelot step, the output; the backward's support, sums and products), each
// reading and writing the whole tensor. Here a row is read once into a buffer that stays in L1, and the threshold is
// found there by Michelot's iteration (as in the ONNX Runtime kernel, export/ort_kernel/sparsegen_lin.cc):
//     tau <- (sum of z over {z > tau} - 1) / |{z > tau}|
// from tau = max - 1, which only moves up and stops exactly at the threshold once the support stops shrinking.
// The backward is the closed form on the support S: dz = (g - mean_S(g)) / (1 - lambda), zero elsewhere.
//
// Rows are split over torch's own intra-op threads: built with -fopenmp, this library's libgomp.so.1 is the one torch
// already loaded (the dynamic linker matches the soname), so `omp parallel` wakes the OpenMP workers torch's matmuls
// just used. Threads of our own would compete with those workers, which spin between torch's parallel regions: that
// made the kernel 2.3x slower inside a training step than alone. The key mask is per batch row ([batch, keys], as
// the encoder's [batch, 1, 1, keys] key mask), shared by the heads and queries of that batch row.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "sparsegen_threshold.h"

namespace {

// Runs body(first, last) over contiguous shares of [0, rows) on the current OpenMP team (one share per thread, as
// at::parallel_for does), on the caller alone for few rows or where OpenMP is not compiled in.
template <typename Body>
void parallel_rows(int64_t rows, Body body) {
#ifdef _OPENMP
  if (rows >= 128 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads();
      const int64_t chunk = (rows + threads - 1) / threads;
      const int64_t first = std::min(rows, omp_get_thread_num() * chunk);
      body(first, std::min(rows, first + chunk));
    }
    return;
  }
#endif
  body(0, rows);
}

}  // namespace

extern "C" {

// scores, out: [rows, keys] float32; mask: [rows / rows_per_mask, keys] bytes (nonzero = may attend), or null.
__attribute__((visibility("default")))
void bertzoo_sparsegen_forward(const float* scores, const uint8_t* mask, float* out, int64_t rows, int64_t keys,
                               int64_t rows_per_mask, float scale) {
  parallel_rows(rows, [=](int64_t first, int64_t last) {
    std::vector<float> z(static_cast<size_t>(keys));
    for (int64_t row = first; row < last; ++row) {
      const float* s = scores + row * keys;
      const uint8_t* m = mask == nullptr ? nullptr : mask + (row / rows_per_mask) * keys;
      float* o = out + row * keys;
      float row_max = -INFINITY;
      for (int64_t i = 0; i < keys; ++i) {
        z[i] = (m == nullptr || m[i]) ? s[i] * scale : -INFINITY;
        row_max = std::max(row_max, z[i]);
      }
      if (row_max == -INFINITY) {  // no key may be attended: all zeros, as the eager code gives
        std::memset(o, 0, sizeof(float) * keys);
        continue;
      }
      for (int64_t i = 0; i < keys; ++i) z[i] -= row_max;
      const float tau = bertzoo::sparsegen_threshold(z.data(), keys);
      for (int64_t i = 0; i < keys; ++i) o[i] = std::max(z[i] - tau, 0.0f);
    }
  });
}

// probs, grad_probs, grad_scores: [rows, keys] float32.
__attribute__((visibility("default")))
void bertzoo_sparsegen_backward(const float* probs, const float* grad_probs, float* grad_scores, int64_t rows,
                                int64_t keys, float scale) {
  parallel_rows(rows, [=](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) {
      const float* p = probs + row * keys;
      const float* g = grad_probs + row * keys;
      float* d = grad_scores + row * keys;
      float sum = 0.0f;
      int64_t count = 0;
      for (int64_t i = 0; i < keys; ++i) {
        const bool in = p[i] > 0.0f;
        sum += in ? g[i] : 0.0f;
        count += in;
      }
      const float mean = count > 0 ? sum / static_cast<float>(count) : 0.0f;
      for (int64_t i = 0; i < keys; ++i) d[i] = p[i] > 0.0f ? (g[i] - mean) * scale : 0.0f;
    }
  });
}

}  // extern "C"
