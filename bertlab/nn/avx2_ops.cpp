/* bertlab's AVX2 kernels as PyTorch operators (bertlab::sgemm, bertlab::qgemm,
   bertlab::attention), so that a program compiled ahead of time (nn/compiled.py) calls them
   from C++ with no Python between:
   the same C functions that avx2.py calls through ctypes in eager mode, with the same
   arguments, checked the same way (avx2.py's docstrings are the contract).

   Built and loaded by avx2.py (``ops``), linked against the kernels' own library, which is
   already loaded in the process; their fake forms (shapes only, for torch.export) are
   registered there too. */

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

extern "C" {
int bertlab_sgemm(const float *a, int64_t m, int64_t k, const float *panels, int64_t n,
                  const float *bias, int gelu, const float *add, const float *lnw,
                  const float *lnb, float eps, float *c, int wide, int threads);
int bertlab_qgemm(const float *a, int64_t m, int64_t k, const float *unsmooth, int levels,
                  int vnni, const int8_t *panels, const int32_t *corr, const float *wscale,
                  int64_t n, const float *bias, int gelu, const float *add, const float *lnw,
                  const float *lnb, float eps, float *c, uint8_t *qa, float *ascale,
                  int threads);
int bertlab_attention(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                      int64_t ldv, float *out, int64_t ldo, const int32_t *starts, int64_t count,
                      int64_t rows, int64_t longest, int64_t heads, int64_t d, float scale,
                      float *scratch, int threads);
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
                 double eps, bool wide) {
  const int64_t k = x.size(-1);
  TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.is_contiguous() && panels.dim() == 3 &&
                  panels.size(0) == (n + PANEL - 1) / PANEL && panels.size(1) == k &&
                  panels.size(2) == PANEL,
              "bertlab::sgemm: panels ", panels.sizes(), " do not fit ", k, " inputs and ", n,
              " outputs");
  TORCH_CHECK(!lnw.has_value() || n % 8 == 0, "bertlab::sgemm: a layer norm needs n % 8 == 0");
  auto [a, out] = frame(x, k, n, add, "sgemm");
  const int64_t rows = k ? a.numel() / k : 0;
  const int status =
      rows && n ? bertlab_sgemm(a.data_ptr<float>(), rows, k, panels.data_ptr<float>(), n,
                                ptr<float>(bias, at::kFloat, n, "bias"), gelu,
                                ptr<float>(add, at::kFloat, rows * n, "add"),
                                ptr<float>(lnw, at::kFloat, n, "lnw"),
                                ptr<float>(lnb, at::kFloat, n, "lnb"), (float)eps,
                                out.data_ptr<float>(), wide, at::get_num_threads())
                : 0;
  TORCH_CHECK(status == 0, "bertlab::sgemm: the wide blocks (sgemm-avx512) need AVX-512F, which "
              "this CPU does not report");
  return out;
}

at::Tensor qgemm(const at::Tensor &x, const at::Tensor &panels, const at::Tensor &corr,
                 const at::Tensor &scale, const std::optional<at::Tensor> &bias,
                 const std::optional<at::Tensor> &unsmooth, int64_t levels, bool vnni, int64_t k,
                 const std::optional<at::Tensor> &add, bool gelu,
                 const std::optional<at::Tensor> &lnw, const std::optional<at::Tensor> &lnb,
                 double eps) {
  const int64_t n = corr.numel(), width = (k + QGROUP - 1) / QGROUP * QGROUP;
  TORCH_CHECK(panels.scalar_type() == at::kChar && panels.is_contiguous() &&
                  panels.numel() == (n + PANEL - 1) / PANEL * PANEL * width,
              "bertlab::qgemm: panels ", panels.sizes(), " do not fit ", k, " inputs and ", n,
              " outputs");
  const int64_t most = vnni ? 127 : 63;
  TORCH_CHECK(levels >= 1 && levels <= most, "bertlab::qgemm: levels ", levels, " outside 1..",
              most);
  TORCH_CHECK(!lnw.has_value() || n % 8 == 0, "bertlab::qgemm: a layer norm needs n % 8 == 0");
  auto [a, out] = frame(x, k, n, add, "qgemm");
  const int64_t rows = k ? a.numel() / k : 0;
  if (rows && n) {
    thread_local std::vector<uint8_t> scratch;  // the rounded rows, then their scales
    scratch.resize(rows * (width + 4));
    const int status = bertlab_qgemm(
        a.data_ptr<float>(), rows, k, ptr<float>(unsmooth, at::kFloat, k, "unsmooth"),
        (int)levels, (int)vnni, panels.data_ptr<int8_t>(), ptr<int32_t>(corr, at::kInt, n, "corr"),
        ptr<float>(scale, at::kFloat, n, "scale"), n, ptr<float>(bias, at::kFloat, n, "bias"),
        gelu, ptr<float>(add, at::kFloat, rows * n, "add"), ptr<float>(lnw, at::kFloat, n, "lnw"),
        ptr<float>(lnb, at::kFloat, n, "lnb"), (float)eps, out.data_ptr<float>(), scratch.data(),
        reinterpret_cast<float *>(scratch.data() + rows * width), at::get_num_threads());
    TORCH_CHECK(status != -2, "bertlab::qgemm: the layer is packed for VNNI, which this CPU does "
                "not have (AVX512-VNNI and AVX512-VL)");
  }
  return out;
}

/* (B, A, T, D) -> (B, T, A, D): B x T rows of a token's heads side by side, at one stride (the
   view itself where its strides allow: a view of the projections' output; else a copy) */
at::Tensor token_rows(const at::Tensor &t) {
  at::Tensor rows = t.transpose(1, 2);
  const bool fits = rows.stride(3) == 1 && rows.stride(2) == rows.size(3) &&
                    rows.stride(0) == rows.size(1) * rows.stride(1);
  return fits ? rows : rows.contiguous();
}

/* q, k, v (B, A, T, D) float32, mask (B, T) bool (true at real tokens) or none -> (B, A, T, D),
   a view of (B, T, A, D) rows: each row's queries over its real keys. Where every row's real
   tokens come first and T <= limit, the kernel runs each row's real tokens as one sequence and
   its padding as another (padding queries see padding keys only; their outputs are unread);
   otherwise PyTorch's attention computes the same. */
at::Tensor attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                     const std::optional<at::Tensor> &mask, int64_t limit) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kFloat && k.sizes() == q.sizes() &&
                  v.sizes() == q.sizes() && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat && q.size(3) % 8 == 0,
              "bertlab::attention: q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes(),
              " must be float32 (B, A, T, D) of one shape, D a multiple of 8");
  const int64_t B = q.size(0), A = q.size(1), T = q.size(2), D = q.size(3);
  TORCH_CHECK(!mask.has_value() || (mask->scalar_type() == at::kBool && mask->dim() == 2 &&
                                    mask->size(0) == B && mask->size(1) == T),
              "bertlab::attention: mask must be bool (", B, ", ", T, ")");
  at::Tensor out = at::empty({B, T, A, D}, q.options());
  std::vector<int32_t> starts{0};  // each row: its real tokens, then its padding
  bool fits = T <= limit;
  at::Tensor keys = mask.has_value() ? mask->contiguous() : at::Tensor();
  for (int64_t b = 0; b < B && fits; b++) {
    int64_t n = T;
    if (mask.has_value()) {
      const bool *row = keys.data_ptr<bool>() + b * T;
      n = 0;
      while (n < T && row[n]) n++;
      for (int64_t j = n; j < T; j++) fits = fits && !row[j];
    }
    starts.push_back((int32_t)(b * T + n));
    starts.push_back((int32_t)((b + 1) * T));
  }
  if (!fits) {  // a longer sequence, or real tokens after padding
    std::optional<at::Tensor> allowed;
    if (mask.has_value()) allowed = mask->view({B, 1, 1, T});
    out.copy_(at::scaled_dot_product_attention(q, k, v, allowed).transpose(1, 2));
    return out.transpose(1, 2);
  }
  if (B * T * A * D == 0) return out.transpose(1, 2);
  const at::Tensor qr = token_rows(q), kr = token_rows(k), vr = token_rows(v);
  const int threads = at::get_num_threads();
  thread_local std::vector<float> scratch;  // each thread's keys transposed, two rows of scores
  scratch.resize(threads * (D + 2) * ((T + 31) / 32 * 32));
  const int status = bertlab_attention(
      qr.data_ptr<float>(), qr.stride(1), kr.data_ptr<float>(), kr.stride(1), vr.data_ptr<float>(),
      vr.stride(1), out.data_ptr<float>(), A * D, starts.data(), (int64_t)starts.size() - 1, B * T,
      T, A, D, (float)std::pow((double)D, -0.5), scratch.data(), threads);
  TORCH_CHECK(status == 0, "bertlab::attention: the kernel refused the sequences");
  return out.transpose(1, 2);
}

}  // namespace

TORCH_LIBRARY(bertlab, m) {
  m.def("sgemm(Tensor x, Tensor panels, Tensor? bias, int n, Tensor? add, bool gelu, "
        "Tensor? lnw, Tensor? lnb, float eps, bool wide=False) -> Tensor");
  m.def("qgemm(Tensor x, Tensor panels, Tensor corr, Tensor scale, Tensor? bias, "
        "Tensor? unsmooth, int levels, bool vnni, int k, Tensor? add, bool gelu, Tensor? lnw, "
        "Tensor? lnb, float eps) -> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, int limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(bertlab, CPU, m) {
  m.impl("sgemm", sgemm);
  m.impl("qgemm", qgemm);
  m.impl("attention", attention);
}
