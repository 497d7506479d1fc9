// sparsegen-lin's threshold for one row, shared by the ONNX Runtime kernel (export/ort_kernel/sparsegen_lin.cc) and
// the training kernel (trainer/sparsegen_cpu.cc); bertzoo.native puts this folder on their include path.
#pragma once

#include <cstdint>

namespace bertzoo {

// Michelot's threshold for one row of `n` values, `z` already scaled and shifted so its max is 0:
//     tau <- (sum of z over {z > tau} - 1) / |{z > tau}|
// from tau = -1 (max - 1, a lower bound), which only moves up and stops exactly at the threshold once the support
// stops shrinking. GCC builds an AVX2 and a baseline copy and picks one at load time: fast where AVX2 exists, runs
// everywhere.
__attribute__((target_clones("avx2", "default")))
inline float sparsegen_threshold(const float* z, int64_t n) {
  float tau = -1.0f;
  int64_t previous = n + 1;
  for (int64_t step = 0; step <= n; ++step) {  // the support shrinks every step but the last: n + 1 bounds it
    float sum = 0.0f;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool above = z[i] > tau;
      sum += above ? z[i] : 0.0f;
      count += above;
    }
    if (count == 0) break;  // only for an all-masked row (every z is -inf)
    tau = (sum - 1.0f) / static_cast<float>(count);
    if (count == previous) break;
    previous = count;
  }
  return tau;
}

}  // namespace bertzoo
