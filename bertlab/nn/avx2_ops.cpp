/* bertlab's AVX2 kernels as PyTorch operators (bertlab::sgemm, bertlab::qgemm), so that a
   program compiled ahead of time (nn/compiled.py) calls them from C++ with no Python between:
   the same C functions that avx2.py calls through ctypes in eager mode, with the same
   arguments, checked the same way (avx2.py's docstrings are the contract).

   Built and loaded by avx2.py (``ops``), linked against the kernels' own library, which is
   already loaded in the process; their fake forms (shapes only, for torch.export) are
   registered there too. */

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <vector>

extern "C" {
void bertlab_sgemm(const float *a, int64_t m, int64_t k, const float *panels, int64_t n,
                   const float *bias, int gelu, const float *add, const float *lnw,
                   const float *lnb, float eps, float *c, int threads);
int bertlab_qgemm(const float *a, int64_t m, int64_t k, const float *unsmooth, int levels,
                  const int8_t *panels, const int32_t *corr, const float *wscale, int64_t n,
                  const float *bias, int gelu, const float *add, const float *lnw,
                  const float *lnb, float eps, float *c, uint8_t *qa, float *ascale,
                  int threads);
}

namespace {

constexpr int64_t PANEL = 16, QGROUP = 4;

template <typename T>
const T *ptr(const std::optional<at::Tensor> &t, at::ScalarType type, int64_t size,
             const char *what) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == type && t->numel() == size && t->is_contiguous(), "bertlab: ",
              what, " must be contiguous, of ", size, " values of ", type, ", got ", t->sizes(),
              " ", t->scalar_type());
  return t->data_ptr<T>();
}

/* (..., k) float32 -> the contiguous input, its row count and the output (..., n) */
std::pair<at::Tensor, at::Tensor> frame(const at::Tensor &x, int64_t k, int64_t n,
                                        const std::optional<at::Tensor> &add, const char *who) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) == k, "bertlab::", who,
              ": input ", x.sizes(), " ", x.scalar_type(), " does not fit ", k,
              " float32 inputs");
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  TORCH_CHECK(!add.has_value() || (add->sizes().vec() == sizes && add->is_contiguous() &&
                                   add->scalar_type() == at::kFloat),
              "bertlab::", who, ": add must be float32, contiguous, of the output's shape");
  return {x.contiguous(), at::empty(sizes, x.options())};
}

at::Tensor sgemm(const at::Tensor &x, const at::Tensor &panels, const std::optional<at::Tensor> &bias,
                 int64_t n, const std::optional<at::Tensor> &add, bool gelu,
                 const std::optional<at::Tensor> &lnw, const std::optional<at::Tensor> &lnb,
                 double eps) {
  const int64_t k = x.size(-1);
  TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.is_contiguous() && panels.dim() == 3 &&
                  panels.size(0) == (n + PANEL - 1) / PANEL && panels.size(1) == k &&
                  panels.size(2) == PANEL,
              "bertlab::sgemm: panels ", panels.sizes(), " do not fit ", k, " inputs and ", n,
              " outputs");
  TORCH_CHECK(!lnw.has_value() || n % 8 == 0, "bertlab::sgemm: a layer norm needs n % 8 == 0");
  auto [a, out] = frame(x, k, n, add, "sgemm");
  const int64_t rows = k ? a.numel() / k : 0;
  if (rows && n)
    bertlab_sgemm(a.data_ptr<float>(), rows, k, panels.data_ptr<float>(), n,
                  ptr<float>(bias, at::kFloat, n, "bias"), gelu,
                  ptr<float>(add, at::kFloat, rows * n, "add"), ptr<float>(lnw, at::kFloat, n, "lnw"),
                  ptr<float>(lnb, at::kFloat, n, "lnb"), (float)eps, out.data_ptr<float>(),
                  at::get_num_threads());
  return out;
}

at::Tensor qgemm(const at::Tensor &x, const at::Tensor &panels, const at::Tensor &corr,
                 const at::Tensor &scale, const std::optional<at::Tensor> &bias,
                 const std::optional<at::Tensor> &unsmooth, int64_t levels, int64_t k,
                 const std::optional<at::Tensor> &add, bool gelu,
                 const std::optional<at::Tensor> &lnw, const std::optional<at::Tensor> &lnb,
                 double eps) {
  const int64_t n = corr.numel(), width = (k + QGROUP - 1) / QGROUP * QGROUP;
  TORCH_CHECK(panels.scalar_type() == at::kChar && panels.is_contiguous() &&
                  panels.numel() == (n + PANEL - 1) / PANEL * PANEL * width,
              "bertlab::qgemm: panels ", panels.sizes(), " do not fit ", k, " inputs and ", n,
              " outputs");
  TORCH_CHECK(levels >= 1 && levels <= 63, "bertlab::qgemm: levels ", levels, " outside 1..63");
  TORCH_CHECK(!lnw.has_value() || n % 8 == 0, "bertlab::qgemm: a layer norm needs n % 8 == 0");
  auto [a, out] = frame(x, k, n, add, "qgemm");
  const int64_t rows = k ? a.numel() / k : 0;
  if (rows && n) {
    thread_local std::vector<uint8_t> scratch;  // the rounded rows, then their scales
    scratch.resize(rows * (width + 4));
    bertlab_qgemm(a.data_ptr<float>(), rows, k, ptr<float>(unsmooth, at::kFloat, k, "unsmooth"),
                  (int)levels, panels.data_ptr<int8_t>(), ptr<int32_t>(corr, at::kInt, n, "corr"),
                  ptr<float>(scale, at::kFloat, n, "scale"), n,
                  ptr<float>(bias, at::kFloat, n, "bias"), gelu,
                  ptr<float>(add, at::kFloat, rows * n, "add"), ptr<float>(lnw, at::kFloat, n, "lnw"),
                  ptr<float>(lnb, at::kFloat, n, "lnb"), (float)eps, out.data_ptr<float>(),
                  scratch.data(), reinterpret_cast<float *>(scratch.data() + rows * width),
                  at::get_num_threads());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(bertlab, m) {
  m.def("sgemm(Tensor x, Tensor panels, Tensor? bias, int n, Tensor? add, bool gelu, "
        "Tensor? lnw, Tensor? lnb, float eps) -> Tensor");
  m.def("qgemm(Tensor x, Tensor panels, Tensor corr, Tensor scale, Tensor? bias, "
        "Tensor? unsmooth, int levels, int k, Tensor? add, bool gelu, Tensor? lnw, Tensor? lnb, "
        "float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertlab, CPU, m) {
  m.impl("sgemm", sgemm);
  m.impl("qgemm", qgemm);
}
