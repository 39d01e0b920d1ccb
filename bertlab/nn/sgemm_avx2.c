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
   libgomp is loaded; how many threads a call takes: team.c). For each panel, the rows go
   through in blocks of up to 6 (ROWS): 6 rows x 16 columns of sums stay in 12 AVX2 registers
   while the k inputs stream past, each step one pair of panel loads, 6 broadcasts of an input
   and 12 fused multiply-adds. The panel (k x 16 floats: 24 KiB at k = 384) stays in the core's
   cache while the row blocks pass over it, and the weights are read from memory once a product,
   each panel while the one before is computed. Each output sums its k terms in order, from
   zero, then adds the bias. No load or store needs aligned memory (a tensor's data may start
   anywhere).

   wide    nonzero (sgemm-avx512, chosen on AMD's Zen 4): the full panels go through in blocks of
           up to 10 rows (WIDE_ROWS) x 16 columns with AVX-512F, one 512-bit register of sums a
           row, each step one panel load and one multiply-add a row whose input is broadcast
           from memory by the instruction itself: half the instructions of the AVX2 blocks for
           the same multiplications, and fewer passes over each panel. The same sums in the
           same order, so the same bits as the AVX2 blocks. Functions compiled for AVX-512F
           alone, called only where the CPU reports it (else -2, nothing written). */

#include <immintrin.h>
#include <stdint.h>

#include "avx2_math.h"
#include "team.h"

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

/* The last panel of an n that is not a multiple of 16: the block (up to 6 rows, also under
   wide) is computed into a 6 x 16 scratch (its bias and add read through scratch copies too),
   then its first `cols` columns are copied out. */
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

/* The wide blocks (see wide above): R rows (1 to 10) x 16 columns, the sums of a row in one
   512-bit register, the epilogue that of the AVX2 blocks on its two 256-bit halves (the same
   GELU to the bit). Only a full panel takes them. */
#define WIDE_ROWS 10
#pragma GCC push_options
#pragma GCC target("avx512f")
#define WSTEP(r) \
  if (R > r) t##r = _mm512_fmadd_ps(_mm512_set1_ps(a[(r) * lda + i]), w, t##r);
#define WSTORE(r)                                                                       \
  if (R > r) {                                                                          \
    if (bias) t##r = _mm512_add_ps(t##r, _mm512_loadu_ps(bias));                        \
    if (gelu) {                                                                         \
      const __m256 lo = _mm512_castps512_ps256(t##r);                                   \
      const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t##r), 1)); \
      t##r = _mm512_castpd_ps(_mm512_insertf64x4(                                       \
          _mm512_castps_pd(_mm512_castps256_ps512(gelu8(lo))), _mm256_castps_pd(gelu8(hi)), 1)); \
    }                                                                                   \
    if (add) t##r = _mm512_add_ps(t##r, _mm512_loadu_ps(add + (r) * ldc));              \
    _mm512_storeu_ps(c + (r) * ldc, t##r);                                              \
  }
#define WIDE(R_)                                                                              \
  static void wide##R_(const float *a, int64_t lda, const float *panel, int64_t k,             \
                       const float *bias, int gelu, const float *add, float *c, int64_t ldc,   \
                       const float *ahead) {                                                  \
    enum { R = R_ };                                                                          \
    const __m512 z = _mm512_setzero_ps();                                                     \
    __m512 t0 = z, t1 = z, t2 = z, t3 = z, t4 = z, t5 = z, t6 = z, t7 = z, t8 = z, t9 = z;    \
    for (int64_t i = 0; i < k; i++) {                                                         \
      const __m512 w = _mm512_loadu_ps(panel + i * PANEL);                                    \
      if (ahead) _mm_prefetch((const char *)(ahead + i * PANEL), _MM_HINT_T1);                \
      WSTEP(0) WSTEP(1) WSTEP(2) WSTEP(3) WSTEP(4) WSTEP(5) WSTEP(6) WSTEP(7) WSTEP(8)         \
      WSTEP(9)                                                                                \
    }                                                                                         \
    WSTORE(0) WSTORE(1) WSTORE(2) WSTORE(3) WSTORE(4) WSTORE(5) WSTORE(6) WSTORE(7)           \
    WSTORE(8) WSTORE(9)                                                                       \
  }
WIDE(1) WIDE(2) WIDE(3) WIDE(4) WIDE(5) WIDE(6) WIDE(7) WIDE(8) WIDE(9) WIDE(10)
typedef void (*wide_fn)(const float *, int64_t, const float *, int64_t, const float *, int,
                        const float *, float *, int64_t, const float *);
static const wide_fn WIDE_BLOCKS[WIDE_ROWS] = {wide1, wide2, wide3, wide4, wide5,
                                               wide6, wide7, wide8, wide9, wide10};
#pragma GCC pop_options

/* Returns 0, or -2 (nothing read or written) where wide is asked of a CPU without AVX-512F. */
int bertlab_sgemm(const float *a, int64_t m, int64_t k, const float *panels, int64_t n,
                  const float *bias, int gelu, const float *add, const float *lnw,
                  const float *lnb, float eps, float *c, int wide, int threads) {
  if (wide && !__builtin_cpu_supports("avx512f")) return -2;
  const int64_t count = (n + PANEL - 1) / PANEL;
  struct bertlab_team team;
  bertlab_team_begin(&team, threads, m);
#pragma omp parallel num_threads(team.size)
  {
#pragma omp for schedule(static) nowait
    for (int64_t p = 0; p < count; p++) {
      const float *panel = panels + p * k * PANEL;
      const int64_t col = p * PANEL;
      const int cols = n - col < PANEL ? (int)(n - col) : PANEL;
      /* the next panel is prefetched into L2 during one pass over this one (the second, where
         there is one: the first reads this panel from memory), one cache line a step */
      const float *next = p + 1 < count ? panel + k * PANEL : 0;
      const int64_t most = wide && cols == PANEL ? WIDE_ROWS : ROWS; /* (partial: 6) */
      const int64_t blocks = (m + most - 1) / most;
      for (int64_t b = 0, row = 0, rows; b < blocks; b++, row += rows) {
        rows = (m - row) / (blocks - b); /* (see ROWS) */
        const float *plus = add ? add + row * n + col : 0;
        const float *ahead = b == (blocks > 1) ? next : 0;
        if (cols == PANEL && wide)
          WIDE_BLOCKS[rows - 1](a + row * k, k, panel, k, bias ? bias + col : 0, gelu, plus,
                                c + row * n + col, n, ahead);
        else if (cols == PANEL)
          block(rows, a + row * k, k, panel, k, bias ? bias + col : 0, gelu, plus,
                c + row * n + col, n, ahead);
        else
          partial(rows, cols, a + row * k, k, panel, k, bias ? bias + col : 0, gelu, plus,
                  c + row * n + col, n);
      }
    }
    BERTLAB_WAIT(team); /* every row is whole before it is normalized */
    if (lnw) {
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < m; r++) layer_norm_row(c + r * n, n, lnw, lnb, eps);
      BERTLAB_WAIT(team);
    }
  }
  bertlab_team_end(&team);
  return 0;
}
