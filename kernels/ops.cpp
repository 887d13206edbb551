// ops.cpp: the only torch binding of the w4 kernels (built by w4cli/gpu/kernels.py with
// torch.utils.cpp_extension.load). Every argument is checked here, with a readable message, before
// any launch; the kernels themselves are torch-free (kernels/w4_kernels.h).
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "w4_kernels.h"

namespace {

// Numbers are turned into strings here, never streamed into TORCH_CHECK: with torch 2.11 + cu130,
// streaming an integer into a TORCH_CHECK message from this extension crashes the process (a
// segfault inside the message formatting), while strings are fine.
std::string num(int64_t v) { return std::to_string(v); }

// msg("K = ", K, " ..."): concatenates strings and integers without the stream formatting above.
inline std::string piece(const std::string& s) { return s; }
inline std::string piece(const char* s) { return s; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
std::string piece(T v) { return std::to_string(v); }
template <typename... A>
std::string msg(const A&... a) {
  std::string r;
  ((r += piece(a)), ...);
  return r;
}

std::string join(c10::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Describes a tensor for error messages: "int32 [4096, 512] on cuda:0".
std::string describe(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " " + join(t.sizes()) + " on " +
         t.device().str();
}

void check_cuda_contiguous(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", describe(t));
  TORCH_CHECK(t.device() == device, name, " must be on ", device.str(), " like qweight, got ",
              describe(t));
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D, got ", describe(t));
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (row-major), got strides ",
              join(t.strides()), " for ", describe(t), "; call .contiguous() first");
}

w4::DType to_w4(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return w4::DType::kF16;
    case at::kBFloat16: return w4::DType::kBF16;
    case at::kFloat: return w4::DType::kF32;
    default: TORCH_CHECK(false, "unsupported dtype ", c10::toString(t));
  }
}

// qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16|bf16
// -> [N, K] (transpose) or [K, N], out_dtype in {float16, bfloat16, float32}.
at::Tensor dequantize_awq(const at::Tensor& qweight, const at::Tensor& qzeros,
                          const at::Tensor& scales, at::ScalarType out_dtype, bool transpose) {
  TORCH_CHECK(qweight.is_cuda(), "dequantize_awq: qweight must be a CUDA tensor, got ",
              describe(qweight));
  const at::Device device = qweight.device();
  check_cuda_contiguous(qweight, "dequantize_awq: qweight", device);
  check_cuda_contiguous(qzeros, "dequantize_awq: qzeros", device);
  check_cuda_contiguous(scales, "dequantize_awq: scales", device);
  TORCH_CHECK(qweight.scalar_type() == at::kInt, "dequantize_awq: qweight must be int32, got ",
              describe(qweight));
  TORCH_CHECK(qzeros.scalar_type() == at::kInt, "dequantize_awq: qzeros must be int32, got ",
              describe(qzeros));
  TORCH_CHECK(scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kBFloat16,
              "dequantize_awq: scales must be float16 or bfloat16, got ", describe(scales));
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16 || out_dtype == at::kFloat,
              "dequantize_awq: out_dtype must be float16, bfloat16 or float32, got ",
              c10::toString(out_dtype));

  const int64_t K = qweight.size(0);
  const int64_t words = qweight.size(1);
  const int64_t N = words * 8;
  const int64_t groups = scales.size(0);
  TORCH_CHECK(K > 0 && words > 0, "dequantize_awq: empty qweight ", describe(qweight));
  TORCH_CHECK(scales.size(1) == N, "dequantize_awq: scales must be [K/G, N] = [*, ", num(N),
              "] for qweight ", describe(qweight), " (N = 8 * qweight.size(1)), got ",
              describe(scales));
  TORCH_CHECK(qzeros.size(1) == words, "dequantize_awq: qzeros must be [K/G, N/8] = [*, ", num(words),
              "], got ", describe(qzeros));
  TORCH_CHECK(qzeros.size(0) == groups, "dequantize_awq: qzeros ", describe(qzeros),
              " and scales ", describe(scales), " must have the same number of groups (rows)");
  TORCH_CHECK(groups > 0 && K % groups == 0, "dequantize_awq: K = ", num(K),
              " is not a multiple of the group size: ", num(groups),
              " scale rows do not divide K evenly (K % G != 0)");
  TORCH_CHECK(K <= INT32_MAX && N <= INT32_MAX, "dequantize_awq: K and N must be below 2^31");
  // N % 8 == 0 holds by construction (N = 8 * words); scales are read 16 bytes at a time.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(scales.data_ptr()) % 16 == 0,
              "dequantize_awq: scales must be 16-byte aligned (its data pointer is not; a view "
              "with a storage offset?); call .clone() first");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(qweight.data_ptr()) % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(qzeros.data_ptr()) % 4 == 0,
              "dequantize_awq: qweight and qzeros must be 4-byte aligned");
  const int64_t G = K / groups;

  const c10::cuda::CUDAGuard guard(device);
  at::Tensor out = transpose ? at::empty({N, K}, qweight.options().dtype(out_dtype))
                             : at::empty({K, N}, qweight.options().dtype(out_dtype));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const cudaError_t err = w4::launch_dequant_awq(
      qweight.data_ptr<int32_t>(), qzeros.data_ptr<int32_t>(), scales.data_ptr(),
      to_w4(scales.scalar_type()), out.data_ptr(), to_w4(out_dtype), K, N, G, transpose, stream);
  TORCH_CHECK(err == cudaSuccess, "dequantize_awq: kernel launch failed: ",
              cudaGetErrorString(err), " (K=", num(K), ", N=", num(N), ", G=", num(G), ")");
  return out;
}

}  // namespace

// Defined in the w4-gemv section at the end of this file.
void register_gemv(py::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "w4 CUDA kernels (see kernels/*.cu)";
  m.def("dequantize_awq", &dequantize_awq, "AWQ gemm int4 -> dense weight, bit-exact",
        py::arg("qweight"), py::arg("qzeros"), py::arg("scales"), py::arg("out_dtype"),
        py::arg("transpose"));
  register_gemv(m);
}

// ---- gemv, batch and dequantize of the w4 GEMV layout ----
// Their checked wrappers above register_gemv, and their m.def(...) inside it.
namespace {

constexpr int64_t kGemvMaxM = 32;

void gemv_check_aligned16(const at::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, msg("gemv: ", name,
              " must be 16-byte aligned (its data pointer is not; a view with a storage "
              "offset?); call .clone() first"));
}

struct LayerShape {
  int64_t K, N, G;
};

// qweight [N/8, ceil(K/128), 8, 16] int32 (w4-gemv); qzeros [K/G, N/8] int32; scales [K/G, N] fp16.
LayerShape check_layer(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                       int64_t K) {
  TORCH_CHECK(qweight.is_cuda(), msg("gemv: qweight must be a CUDA tensor, got ", describe(qweight)));
  const at::Device device = qweight.device();
  TORCH_CHECK(qweight.scalar_type() == at::kInt && qweight.dim() == 4 && qweight.size(2) == 8 &&
                  qweight.size(3) == 16, msg("gemv: qweight must be int32 [N/8, ceil(K/128), 8, 16] (w4-gemv layout), got ",
              describe(qweight)));
  TORCH_CHECK(qweight.is_contiguous(), msg("gemv: qweight must be contiguous, got ", describe(qweight)));
  check_cuda_contiguous(qzeros, "gemv: qzeros", device);
  check_cuda_contiguous(scales, "gemv: scales", device);
  TORCH_CHECK(qzeros.scalar_type() == at::kInt, msg("gemv: qzeros must be int32, got ",
              describe(qzeros)));
  TORCH_CHECK(scales.scalar_type() == at::kHalf, msg("gemv: scales must be float16, got ",
              describe(scales)));
  const int64_t N = qweight.size(0) * 8;
  const int64_t groups = scales.size(0);
  TORCH_CHECK(N > 0 && K > 0, msg("gemv: empty weight or activations: K = ", K, ", qweight ",
              describe(qweight)));
  TORCH_CHECK(qweight.size(1) == (K + 127) / 128, msg("gemv: qweight ", describe(qweight),
              " holds ceil(K/128) = ", qweight.size(1), " k-blocks but K = ", K,
              " (needs ", (K + 127) / 128, ")"));
  TORCH_CHECK(K % 8 == 0, msg("gemv: K = ", K, " must be a multiple of 8 (16-byte activation rows)"));
  TORCH_CHECK(scales.size(1) == N, msg("gemv: scales must be [K/G, N] = [*, ", N, "], got ",
              describe(scales)));
  TORCH_CHECK(qzeros.size(0) == groups && qzeros.size(1) == N / 8, msg("gemv: qzeros must be [K/G, N/8] = [", groups, ", ", N / 8, "], got ",
              describe(qzeros)));
  TORCH_CHECK(groups > 0 && K % groups == 0, msg("gemv: K = ", K, " is not a multiple of the ", groups,
              " scale rows (K % G != 0)"));
  const int64_t G = K / groups;
  TORCH_CHECK(G % 32 == 0 || groups == 1, msg("gemv: group size ", G,
              " must be a multiple of 32 (or one group per row)"));
  TORCH_CHECK(K < (int64_t{1} << 21) && N < (int64_t{1} << 31), msg("gemv: K must be below 2^21 and N "
              "below 2^31, got K=", K, " N=", N));
  gemv_check_aligned16(qweight, "qweight");
  return {K, N, G};
}

// x [M, K] fp16 with max_m >= M; bias [N] fp16 or None -> the layer's shape and the bias pointer.
LayerShape check_operands(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qzeros,
                          const at::Tensor& scales, const c10::optional<at::Tensor>& bias,
                          int64_t max_m, const char* who, const void** bias_ptr) {
  TORCH_CHECK(qweight.is_cuda(), msg("gemv: qweight must be a CUDA tensor, got ", describe(qweight)));
  const at::Device device = qweight.device();
  TORCH_CHECK(x.is_cuda() && x.device() == device, msg("gemv: x must be on ", device.str(),
              " like qweight, got ", describe(x)));
  TORCH_CHECK(x.dim() == 2, msg("gemv: x must be 2-D [M, K], got ", describe(x)));
  TORCH_CHECK(x.scalar_type() == at::kHalf, msg("gemv: x must be float16, got ", describe(x)));
  TORCH_CHECK(x.is_contiguous(), msg("gemv: x must be contiguous (row-major), got a strided ",
              describe(x), "; call .contiguous() first"));
  TORCH_CHECK(x.size(0) <= max_m, msg(who, ": x has M = ", x.size(0), " rows; the kernel takes at most ",
              max_m, " (w4cli.gpu.kernels.gemv splits larger batches)"));
  const LayerShape shape = check_layer(qweight, qzeros, scales, x.size(1));
  gemv_check_aligned16(x, "x");
  *bias_ptr = nullptr;
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    TORCH_CHECK(b.is_cuda() && b.device() == device, msg("gemv: bias must be on ", device.str(),
                ", got ", describe(b)));
    TORCH_CHECK(b.scalar_type() == at::kHalf && b.dim() == 1 && b.size(0) == shape.N &&
                    b.is_contiguous(), msg("gemv: bias must be a contiguous float16 [", shape.N, "], got ", describe(b)));
    *bias_ptr = b.data_ptr();
  }
  return shape;
}

// x [M, K] fp16, M <= 32; the layer; bias [N] fp16 or None -> y [M, N] fp16. splits: 0 = automatic;
// pdl: programmatic dependent launch (w4_kernels.h).
at::Tensor gemv_w4_impl(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qzeros,
                        const at::Tensor& scales, const c10::optional<at::Tensor>& bias,
                        int64_t splits, bool pdl) {
  const void* bias_ptr = nullptr;
  const LayerShape s = check_operands(x, qweight, qzeros, scales, bias, kGemvMaxM, "gemv", &bias_ptr);
  TORCH_CHECK(splits >= 0 && splits <= 16, msg("gemv: splits must be 0 (automatic) .. 16, got ", splits));
  const int64_t M = x.size(0);
  const c10::cuda::CUDAGuard guard(qweight.device());
  at::Tensor y = at::empty({M, s.N}, x.options());
  if (M == 0) return y;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(qweight.device().index()).stream();
  const cudaError_t err = w4::launch_gemv_w4a16(
      x.data_ptr(), qweight.data_ptr<int32_t>(), qzeros.data_ptr<int32_t>(), scales.data_ptr(),
      bias_ptr, y.data_ptr(), M, s.K, s.N, s.G, static_cast<int>(splits), pdl, stream);
  TORCH_CHECK(err == cudaSuccess, msg("gemv: kernel launch failed: ", cudaGetErrorString(err),
              " (M=", M, ", K=", s.K, ", N=", s.N, ", G=", s.G, ", splits=", splits, ")"));
  return y;
}

// x [M, K] fp16, M <= 128 (64 on mma.sync, 65536 on the warp-specialised kernel); the layer; bias -> y [M, N] fp16.
// splits, tiles: 0 = automatic; kernel: 1 = mma.sync, 2 = wgmma, 3 = warp-specialised wgmma; pdl: programmatic
// dependent launch; order: the wgmma kernels' k order, 0 = automatic (w4_kernels.h).
at::Tensor gemm_w4_batch_impl(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qzeros,
                              const at::Tensor& scales, const c10::optional<at::Tensor>& bias,
                              int64_t splits, int64_t tiles, int64_t kernel, bool pdl, int64_t order) {
  const void* bias_ptr = nullptr;
  TORCH_CHECK(kernel >= 1 && kernel <= 3,
              msg("batch: kernel must be 1 (mma.sync), 2 (wgmma) or 3 (warp-specialised wgmma), got ", kernel));
  const int64_t max_m = kernel == 3 ? w4::kWsMaxM : w4::kWgmmaMaxM;  // mma.sync's 64 is its plan's refusal
  const LayerShape s = check_operands(x, qweight, qzeros, scales, bias, max_m, "batch", &bias_ptr);
  TORCH_CHECK(splits >= 0 && splits <= 64, msg("batch: splits must be 0 (automatic) .. 64, got ", splits));
  TORCH_CHECK(order >= 0 && order <= 2, msg("batch: order must be 0 (automatic), 1 (permuted) or 2 (natural), got ",
              order));
  gemv_check_aligned16(scales, "scales");  // copied to shared memory 16 bytes at a time
  const int64_t M = x.size(0);
  const c10::cuda::CUDAGuard guard(qweight.device());
  at::Tensor y = at::empty({M, s.N}, x.options());
  if (M == 0) return y;
  w4::BatchPlan plan;
  cudaError_t err = w4::plan_gemm_w4a16_batch(M, s.K, s.N, s.G, static_cast<int>(splits),
                                              static_cast<int>(tiles), static_cast<int>(kernel), static_cast<int>(order),
                                              &plan);
  TORCH_CHECK(err == cudaSuccess, msg("batch: no kernel for M=", M, ", K=", s.K, ", N=", s.N, ", G=", s.G,
              ", splits=", splits, ", tiles=", tiles, ", kernel=", kernel, ", order=", order, " on this GPU: ",
              cudaGetErrorString(err)));
  at::Tensor partial, counters, scratch;
  if (plan.kernel == 1 && plan.splits > 1) {  // the wgmma kernels add their splits within a cluster
    partial = at::empty({plan.splits, M, s.N}, x.options().dtype(at::kFloat));
    counters = at::empty({(int64_t)plan.row_blocks}, x.options().dtype(at::kInt));
  }
  if (plan.scratch_bytes > 0) scratch = at::empty({plan.scratch_bytes}, x.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(qweight.device().index()).stream();
  err = w4::launch_gemm_w4a16_batch(
      x.data_ptr(), scratch.defined() ? scratch.data_ptr() : nullptr, qweight.data_ptr<int32_t>(),
      qzeros.data_ptr<int32_t>(), scales.data_ptr(), bias_ptr, y.data_ptr(),
      partial.defined() ? partial.data_ptr<float>() : nullptr,
      counters.defined() ? counters.data_ptr<int32_t>() : nullptr, M, s.K, s.N, s.G, plan, pdl, stream);
  TORCH_CHECK(err == cudaSuccess, msg("batch: kernel launch failed: ", cudaGetErrorString(err),
              " (M=", M, ", K=", s.K, ", N=", s.N, ", G=", s.G, ", splits=", plan.splits, ")"));
  return y;
}

// The layer -> its fp16 weight [N, K], bit-identical to w4_gemv.dequantize.
at::Tensor dequantize_w4_gemv_impl(const at::Tensor& qweight, const at::Tensor& qzeros,
                                   const at::Tensor& scales, int64_t K) {
  const LayerShape s = check_layer(qweight, qzeros, scales, K);
  const c10::cuda::CUDAGuard guard(qweight.device());
  at::Tensor out = at::empty({s.N, s.K}, scales.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(qweight.device().index()).stream();
  const cudaError_t err = w4::launch_dequant_w4_gemv(qweight.data_ptr<int32_t>(), qzeros.data_ptr<int32_t>(),
                                                     scales.data_ptr(), out.data_ptr(), s.K, s.N, s.G, stream);
  TORCH_CHECK(err == cudaSuccess, msg("dequantize_w4_gemv: kernel launch failed: ", cudaGetErrorString(err),
              " (K=", s.K, ", N=", s.N, ", G=", s.G, ")"));
  return out;
}

}  // namespace

void register_gemv(py::module_& m) {
  m.def("gemv_w4", &gemv_w4_impl,
        "y[M, N] = x[M, K] W^T (+ bias), int4 W in the w4-gemv layout, M <= 32, fp16, fp32 sums",
        py::arg("x"), py::arg("qweight"), py::arg("qzeros"), py::arg("scales"),
        py::arg("bias") = py::none(), py::arg("splits") = 0, py::arg("pdl") = false);
  m.def("gemm_w4_batch", &gemm_w4_batch_impl,
        "y[M, N] = x[M, K] W^T (+ bias), int4 W in the w4-gemv layout, one read of W per tile of tokens",
        py::arg("x"), py::arg("qweight"), py::arg("qzeros"), py::arg("scales"),
        py::arg("bias") = py::none(), py::arg("splits") = 0, py::arg("tiles") = 0, py::arg("kernel") = 1,
        py::arg("pdl") = false, py::arg("order") = 0);
  m.def("dequantize_w4_gemv", &dequantize_w4_gemv_impl,
        "w4-gemv layer -> fp16 weight [N, K], bit-exact", py::arg("qweight"), py::arg("qzeros"),
        py::arg("scales"), py::arg("k"));
}
