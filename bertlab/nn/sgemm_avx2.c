/* bertlab's float32 product for AVX2 CPUs: c = norm(act(a . w^T + bias) (+ add)), on w packed
   once, act GELU (with erf) or none, norm a layer norm of each row or none.

   Built and loaded by avx2.py, which says when it is used and why (bertlab.nn.cpu chooses it).

   a       (m, k) row-major: the input rows
   panels  the weight w (n, k) in panels of 16 output columns: panel p holds, for each of the k
           inputs in turn, the 16 weights of columns 16p..16p+15 (zeros past n); so one panel is
           one contiguous (k, 16) block, read from start to end by each pass over it
   bias    (n) or NULL;  add  (m, n) row-major or NULL (a residual summed into the result)
   gelu    nonzero: GELU applied to each sum and bias while it is in a register (avx2_math.h)
   lnw, lnb (n) or NULL: each finished row of c normalized by its mean and variance, then
           times lnw plus lnb (eps added to the variance), n a multiple of 8 (avx2_math.h)
   c       (m, n) row-major: the output

   Each thread takes whole panels (OpenMP, PyTorch's own runtime: avx2.py checks that one
   libgomp is loaded). For each panel, the rows go through in blocks of up to 6 (ROWS): 6
   rows x 16 columns of sums stay in 12 AVX2 registers while the k inputs stream past, each step
   one pair of panel loads, 6 broadcasts of an input and 12 fused multiply-adds. The panel (k x
   16 floats: 24 KiB at k = 384) stays in the core's cache while the row blocks pass over it, and
   the weights are read from memory once a product, each panel while the one before is computed.
   Each output sums its k terms in order, from zero, then adds the bias. No load or store needs
   aligned memory (a tensor's data may start anywhere). */

#include <immintrin.h>
#include <stdint.h>

#include "avx2_math.h"

#define PANEL 16
/* The most rows of a block. The m rows go through in the fewest blocks of at most ROWS, their
   sizes as even as can be (21 rows: 5, 5, 5, 6, not 6, 6, 6, 3): a block of few rows keeps too
   few sums in flight to hide the multiply-adds' latency. */
#define ROWS 6

/* One block of R rows (1 to 6) x 16 columns over the k inputs; the first `cols` columns are
   written (16, or fewer in the last panel). Written once for every R: the compiler keeps the
   2R sums in registers only when each is a variable of its own. */
#define STEP(r)                                                           \
  if (R > r) {                                                            \
    __m256 x = _mm256_broadcast_ss(a + (r) * lda + i);                    \
    s##r##0 = _mm256_fmadd_ps(x, w0, s##r##0);                            \
    s##r##1 = _mm256_fmadd_ps(x, w1, s##r##1);                            \
  }
#define STORE(r)                                                              \
  if (R > r) {                                                                \
    if (bias) {                                                               \
      s##r##0 = _mm256_add_ps(s##r##0, _mm256_loadu_ps(bias));                \
      s##r##1 = _mm256_add_ps(s##r##1, _mm256_loadu_ps(bias + 8));            \
    }                                                                         \
    if (gelu) {                                                               \
      s##r##0 = gelu8(s##r##0);                                               \
      s##r##1 = gelu8(s##r##1);                                               \
    }                                                                         \
    if (add) {                                                                \
      s##r##0 = _mm256_add_ps(s##r##0, _mm256_loadu_ps(add + (r) * ldc));     \
      s##r##1 = _mm256_add_ps(s##r##1, _mm256_loadu_ps(add + (r) * ldc + 8)); \
    }                                                                         \
    _mm256_storeu_ps(c + (r) * ldc, s##r##0);                                 \
    _mm256_storeu_ps(c + (r) * ldc + 8, s##r##1);                             \
  }
#define BLOCK(R_)                                                                         \
  static void block##R_(const float *a, int64_t lda, const float *panel, int64_t k,        \
                        const float *bias, int gelu, const float *add, float *c,           \
                        int64_t ldc, const float *ahead) {                                \
    enum { R = R_ };                                                                      \
    const __m256 z = _mm256_setzero_ps();                                                 \
    __m256 s00 = z, s01 = z, s10 = z, s11 = z, s20 = z, s21 = z;                          \
    __m256 s30 = z, s31 = z, s40 = z, s41 = z, s50 = z, s51 = z;                          \
    for (int64_t i = 0; i < k; i++) {                                                     \
      __m256 w0 = _mm256_loadu_ps(panel + i * PANEL);                                     \
      __m256 w1 = _mm256_loadu_ps(panel + i * PANEL + 8);                                 \
      if (ahead) _mm_prefetch((const char *)(ahead + i * PANEL), _MM_HINT_T1);            \
      STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)                                     \
    }                                                                                     \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)                                 \
  }
BLOCK(1) BLOCK(2) BLOCK(3) BLOCK(4) BLOCK(5) BLOCK(6)

/* A block of `rows` rows (1 to 6): each size is its own function, its sums in registers. */
static void block(int rows, const float *a, int64_t lda, const float *panel, int64_t k,
                  const float *bias, int gelu, const float *add, float *c, int64_t ldc,
                  const float *ahead) {
  switch (rows) {
    case 6: block6(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
    case 5: block5(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
    case 4: block4(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
    case 3: block3(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
    case 2: block2(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
    default: block1(a, lda, panel, k, bias, gelu, add, c, ldc, ahead); break;
  }
}

/* The last panel of an n that is not a multiple of 16: the block is computed into a 6 x 16
   scratch (its bias and add read through scratch copies too), then its first `cols` columns are
   copied out. */
static void partial(int rows, int cols, const float *a, int64_t lda, const float *panel,
                    int64_t k, const float *bias, int gelu, const float *add, float *c,
                    int64_t ldc) {
  float out[ROWS * PANEL], plus[ROWS * PANEL] = {0}, b[PANEL] = {0};
  for (int j = 0; j < cols; j++) b[j] = bias ? bias[j] : 0.f;
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < PANEL; j++) plus[r * PANEL + j] = add && j < cols ? add[r * ldc + j] : 0.f;
  block(rows, a, lda, panel, k, b, gelu, add ? plus : 0, out, PANEL, 0);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols; j++) c[r * ldc + j] = out[r * PANEL + j];
}

void bertlab_sgemm(const float *a, int64_t m, int64_t k, const float *panels, int64_t n,
                   const float *bias, int gelu, const float *add, const float *lnw,
                   const float *lnb, float eps, float *c, int threads) {
  const int64_t count = (n + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; p++) {
      const float *panel = panels + p * k * PANEL;
      const int64_t col = p * PANEL;
      const int cols = n - col < PANEL ? (int)(n - col) : PANEL;
      /* the next panel is prefetched into L2 during one pass over this one (the second, where
         there is one: the first reads this panel from memory), one cache line a step */
      const float *next = p + 1 < count ? panel + k * PANEL : 0;
      const int64_t blocks = (m + ROWS - 1) / ROWS;
      for (int64_t b = 0, row = 0, rows; b < blocks; b++, row += rows) {
        rows = (m - row) / (blocks - b); /* (see ROWS) */
        const float *plus = add ? add + row * n + col : 0;
        if (cols == PANEL)
          block(rows, a + row * k, k, panel, k, bias ? bias + col : 0, gelu, plus,
                c + row * n + col, n, b == (blocks > 1) ? next : 0);
        else
          partial(rows, cols, a + row * k, k, panel, k, bias ? bias + col : 0, gelu, plus,
                  c + row * n + col, n);
      }
    }
    /* (the loop's barrier: every row is whole before it is normalized) */
    if (lnw) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < m; r++) layer_norm_row(c + r * n, n, lnw, lnb, eps);
    }
  }
}
