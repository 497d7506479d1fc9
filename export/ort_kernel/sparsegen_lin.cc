// bertzoo.SparsegenLin as a native ONNX Runtime CPU kernel (custom op library, C API only).
//
// The op (export/sparsegen_onnx.py): probs = max(0, (z - tau) / (1 - lambda)) over the last axis of `scores`,
// i.e. sparsemax of scores / (1 - lambda); `mask` (bool, broadcastable to scores) gives False keys exactly zero.
// A row with no True key is all zeros, as in the ONNX function body.
//
// Why a kernel: the op is memory-bound, and any graph of standard ops makes a dozen passes over the
// [batch, heads, queries, keys] tensor per layer (each op reads and writes all of it). Here each row is loaded once
// into a small buffer that stays in L1, and tau is found there by Michelot's iteration:
//     tau <- (sum of z over {z > tau} - 1) / |{z > tau}|
// Started from tau = max - 1 (a lower bound: the max key alone already has mass >= 1 above it), it only moves up,
// and stops exactly at sparsemax's threshold once the support stops shrinking: exact, no sort, typically 2-5 passes
// over a row that is already in cache. Rows are split over ONNX Runtime's own intra-op threads.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "onnxruntime_c_api.h"
#include "sparsegen_threshold.h"

namespace {

const OrtApi* g_api = nullptr;
constexpr int kMaxRank = 8;

struct Kernel {
  float scale;  // 1 / (1 - lambda)
};

struct Job {
  const float* scores;
  const bool* mask;
  float* out;
  int64_t rows, keys, chunk;
  int rank;
  int64_t row_dims[kMaxRank];      // the leading (non-key) dims of scores
  int64_t mask_strides[kMaxRank];  // mask element stride per leading dim (0 where broadcast)
  int64_t mask_key_stride;         // 1, or 0 when the mask's last dim is broadcast
  float scale;
};

void run_rows(void* data, size_t part) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(part) * job.chunk;
  const int64_t last = std::min(job.rows, first + job.chunk);
  const float neg_inf = -INFINITY;
  std::vector<float> z(static_cast<size_t>(job.keys));
  for (int64_t row = first; row < last; ++row) {
    int64_t mask_offset = 0;
    for (int64_t d = job.rank - 2, rest = row; d >= 0; --d) {
      mask_offset += (rest % job.row_dims[d]) * job.mask_strides[d];
      rest /= job.row_dims[d];
    }
    const float* s = job.scores + row * job.keys;
    const bool* m = job.mask + mask_offset;
    float* out = job.out + row * job.keys;
    float row_max = neg_inf;
    for (int64_t i = 0; i < job.keys; ++i) {
      z[i] = m[i * job.mask_key_stride] ? s[i] * job.scale : neg_inf;
      row_max = std::max(row_max, z[i]);
    }
    if (row_max == neg_inf) {
      std::memset(out, 0, sizeof(float) * job.keys);
      continue;
    }
    for (int64_t i = 0; i < job.keys; ++i) z[i] -= row_max;  // -inf stays -inf
    const float tau = bertzoo::sparsegen_threshold(z.data(), job.keys);
    for (int64_t i = 0; i < job.keys; ++i) out[i] = std::max(z[i] - tau, 0.0f);
  }
}

// Every API call returns an OrtStatus*; hand the first failure back to ONNX Runtime unchanged.
#define RETURN_IF_ERROR(expr)            \
  do {                                   \
    OrtStatus* status_ = (expr);         \
    if (status_ != nullptr) return status_; \
  } while (0)

OrtStatus* shape_of(const OrtValue* value, std::vector<int64_t>& dims, ONNXTensorElementDataType* type) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* status = g_api->GetDimensionsCount(info, &rank);
  if (status == nullptr) {
    dims.resize(rank);
    status = g_api->GetDimensions(info, dims.data(), rank);
  }
  if (status == nullptr) status = g_api->GetTensorElementType(info, type);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

OrtStatus* fail(const char* message) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, message); }

OrtStatus* ORT_API_CALL compute(void* op_kernel, OrtKernelContext* context) {
  const Kernel& kernel = *static_cast<const Kernel*>(op_kernel);
  const OrtValue* scores = nullptr;
  const OrtValue* mask = nullptr;
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, 0, &scores));
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, 1, &mask));
  std::vector<int64_t> dims, mask_dims;
  ONNXTensorElementDataType scores_type, mask_type;
  RETURN_IF_ERROR(shape_of(scores, dims, &scores_type));
  RETURN_IF_ERROR(shape_of(mask, mask_dims, &mask_type));
  if (scores_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return fail("SparsegenLin kernel: scores must be float32");
  if (mask_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL) return fail("SparsegenLin kernel: mask must be bool");
  const int rank = static_cast<int>(dims.size());
  if (rank < 1 || rank > kMaxRank || mask_dims.size() > dims.size()) {
    return fail("SparsegenLin kernel: scores rank must be 1..8 and at least the mask's rank");
  }
  // Right-align the mask's shape to the scores' (numpy broadcasting) and check every dim is 1 or equal.
  std::vector<int64_t> aligned(rank, 1);
  std::copy(mask_dims.begin(), mask_dims.end(), aligned.begin() + (rank - mask_dims.size()));
  Job job{};
  job.rank = rank;
  job.keys = dims[rank - 1];
  job.rows = 1;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (aligned[d] != 1 && aligned[d] != dims[d]) return fail("SparsegenLin kernel: mask does not broadcast to scores");
    const int64_t s = aligned[d] == 1 ? 0 : stride;
    if (d == rank - 1) {
      job.mask_key_stride = s;
    } else {
      job.mask_strides[d] = s;
      job.row_dims[d] = dims[d];
      job.rows *= dims[d];
    }
    stride *= aligned[d];
  }
  OrtValue* out = nullptr;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, dims.data(), dims.size(), &out));
  if (job.rows == 0 || job.keys == 0) return nullptr;
  void* scores_data = nullptr;
  void* mask_data = nullptr;
  void* out_data = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(scores), &scores_data));
  RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(mask), &mask_data));
  RETURN_IF_ERROR(g_api->GetTensorMutableData(out, &out_data));
  job.scores = static_cast<const float*>(scores_data);
  job.mask = static_cast<const bool*>(mask_data);
  job.out = static_cast<float*>(out_data);
  job.scale = kernel.scale;
  // Parts of ~16K elements: big enough to amortise a task, small enough to balance the threads.
  job.chunk = std::max<int64_t>(1, 16384 / job.keys);
  const int64_t parts = (job.rows + job.chunk - 1) / job.chunk;
  return g_api->KernelContext_ParallelFor(context, run_rows, static_cast<size_t>(parts), 0, &job);
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                      void** kernel) {
  float lambda = 0.0f;
  RETURN_IF_ERROR(api->KernelInfoGetAttribute_float(info, "lambda", &lambda));
  if (!(lambda < 1.0f)) return api->CreateStatus(ORT_INVALID_ARGUMENT, "SparsegenLin: attribute lambda must be < 1");
  *kernel = new Kernel{1.0f / (1.0f - lambda)};
  return nullptr;
}

void ORT_API_CALL destroy_kernel(void* kernel) { delete static_cast<Kernel*>(kernel); }
const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "SparsegenLin"; }
const char* ORT_API_CALL op_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t index) {
  return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
}
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return 2; }
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL memory_type(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL one(const OrtCustomOp*) { return 1; }
int ORT_API_CALL start_version(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return INT_MAX; }

OrtCustomOp make_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof(op));  // every callback this op does not need stays null, which ORT accepts
  op.version = ORT_API_VERSION;
  op.GetName = op_name;
  op.GetExecutionProviderType = op_provider;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.GetOutputType = output_type;
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_kernel;
  op.GetInputCharacteristic = required;
  op.GetOutputCharacteristic = required;
  op.GetInputMemoryType = memory_type;
  op.GetVariadicInputMinArity = one;
  op.GetVariadicInputHomogeneity = one;
  op.GetVariadicOutputMinArity = one;
  op.GetVariadicOutputHomogeneity = one;
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.GetStartVersion = start_version;
  op.GetEndVersion = end_version;
  return op;
}

const OrtCustomOp g_op = make_op();

}  // namespace

// The entry point SessionOptions.register_custom_ops_library() looks up.
extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                           const OrtApiBase* base) {
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == nullptr) return nullptr;  // cannot even report: the runtime is older than the headers
  OrtCustomOpDomain* domain = nullptr;
  RETURN_IF_ERROR(g_api->CreateCustomOpDomain("bertzoo", &domain));
  RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &g_op));
  return g_api->AddCustomOpDomain(options, domain);
}
