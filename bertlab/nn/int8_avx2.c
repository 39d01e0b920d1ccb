/* bertlab's int8 product for AVX2 CPUs, and with VNNI:
   c = norm(act(s_x (q(x) . w^T) s_w + bias) (+ add)), the activations rounded per token inside
   the call, on an int8 weight packed once; act GELU (with erf) or none, norm a layer norm of
   each row or none (as in sgemm_avx2.c).

   Built and loaded by avx2.py, which says when it is used and why (bertlab.nn.cpu chooses it).
   The numbers are precision.py's (its module docstring): per-token activations with L levels,
   per-channel int8 weights, the sums exact in int32.

   a        (m, k) row-major float32: the input rows
   unsmooth (k) or NULL: each input column is multiplied by it before it is rounded
   levels   L, at most 63 (127 with vnni): each row t is rounded to q = round(t / s) in
            -L..L with s = max(max|t| / L, the smallest normal float), the scale ascale[r] = s
   panels   the int8 weight w (n, k) in panels of 16 output columns and groups of 4 inputs: for
            each group g of inputs 4g..4g+3 (zeros past k), panel p holds 64 bytes, the 4
            weights of column 16p in input order, then of column 16p+1, ... 16p+15 (zeros past
            n); one panel is one contiguous block of ceil(k/4) x 64 bytes
   corr     (n) int32: (L + 1) times the sum of each weight row (the zero point's share)
   wscale   (n) the weights' scales;  bias (n) or NULL;  add (m, n) or NULL
   lnw, lnb (n) or NULL, eps: the layer norm of each finished row (n a multiple of 8)
   c        (m, n) row-major float32: the output
   qa       m x ceil(k/4) x 4 bytes of scratch: the rounded rows;  ascale (m) floats of scratch

   The rounded rows are stored shifted by L + 1, as unsigned bytes 1..2L+1, so VPMADDUBSW can
   multiply them with the signed weights: it adds two u8 x s8 products in 16 bits, which holds
   2 x 127 x 127 = 32,258 (8-bit activations, 255 x 127 x 2, would saturate; hence L <= 63).
   VPMADDWD then adds pairs of those into 32 bits: each step sums 4 inputs of 8 columns. The
   shift is taken back at the end, sum(u w) - (L + 1) sum(w) = sum(q w), exactly. Where the
   layer was packed for VNNI (vnni: u8-vnni), one VPDPBUSD does those three instructions' work
   into 32 bits, where nothing saturates, so L may be 127 (bytes 1..255).

   The rounding is done once for all rows, then each thread takes whole panels (OpenMP,
   PyTorch's own runtime: avx2.py checks that one libgomp is loaded; how many threads: team.c).
   For each panel the rows go through in blocks of up to 6 (with VNNI, 10: below), as even as
   can be: 6 rows x 16 columns of sums stay in 12 registers while the inputs stream past, each
   step of 4 inputs one pair of panel loads, 6 broadcasts and 12 of each of VPMADDUBSW, VPMADDWD
   and VPADDD (or 12 VPDPBUSD), and the panel (6 KiB at k = 384) stays in the core's cache. No
   load or store needs aligned memory. */

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "avx2_math.h"
#include "team.h"

#define PANEL 16
#define ROWS 6
#define GROUP 64 /* bytes of a panel per group of 4 inputs */

/* One row's scale: t = a * unsmooth, s = max|t| / L, at least FLT_MIN (a row of zeros). */
static float row_scale(const float *a, int64_t k, const float *unsmooth, int levels) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 top = _mm256_setzero_ps();
  float last = 0.f;
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256 t = _mm256_loadu_ps(a + j);
    if (unsmooth) t = _mm256_mul_ps(t, _mm256_loadu_ps(unsmooth + j));
    top = _mm256_max_ps(top, _mm256_and_ps(t, absmask));
  }
  for (; j < k; j++) last = fmaxf(last, fabsf(unsmooth ? a[j] * unsmooth[j] : a[j]));
  float lanes[8];
  _mm256_storeu_ps(lanes, top);
  for (int i = 0; i < 8; i++) last = fmaxf(last, lanes[i]);
  const float s = last / (float)levels;
  return s >= FLT_MIN ? s : FLT_MIN;
}

/* One row: t = a * unsmooth, s = row_scale, u = round(t / s) + L + 1, as precision.py computes
   them (the same products, division and rounding to even). */
static void quantize(const float *a, int64_t k, const float *unsmooth, int levels, uint8_t *u,
                     int64_t kp, float *scale) {
  const float s = row_scale(a, k, unsmooth, levels);
  *scale = s;
  const __m256 vs = _mm256_set1_ps(s);
  const __m256i shift = _mm256_set1_epi32(levels + 1);
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256 t = _mm256_loadu_ps(a + j);
    if (unsmooth) t = _mm256_mul_ps(t, _mm256_loadu_ps(unsmooth + j));
    /* (the default rounding mode rounds halves to even, as torch.round) */
    __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(t, vs)), shift);
    /* 8 int32 of 1..127 -> 8 bytes */
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i w16 = _mm_packs_epi32(lo, hi);
    __m128i b8 = _mm_packus_epi16(w16, w16);
    _mm_storel_epi64((__m128i *)(u + j), b8);
  }
  for (; j < k; j++) {
    float t = unsmooth ? a[j] * unsmooth[j] : a[j];
    u[j] = (uint8_t)((int)nearbyintf(t / s) + levels + 1);
  }
  for (; j < kp; j++) u[j] = 0; /* (against zero weights: nothing) */
}

#define STEP(r)                                                                 \
  if (R > r) {                                                                  \
    __m256i x = _mm256_set1_epi32(*(const int32_t *)(u + (r) * kp + 4 * g));    \
    s##r##0 = _mm256_add_epi32(s##r##0,                                         \
                               _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), ones)); \
    s##r##1 = _mm256_add_epi32(s##r##1,                                         \
                               _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), ones)); \
  }
/* sum(q w) = sum(u w) - corr, times s_w, then times the row's s plus the bias in one rounding:
   precision.py's float32 arithmetic to the bit (torch.addcmul fuses the same way); then GELU,
   then the residual */
#define FINISH(r, h)                                                                         \
  {                                                                                          \
    __m256 y = _mm256_cvtepi32_ps(_mm256_sub_epi32(s##r##h, _mm256_loadu_si256(              \
                                                                (const __m256i *)(corr + 8 * h)))); \
    y = _mm256_mul_ps(y, _mm256_loadu_ps(wscale + 8 * h));                                   \
    y = bias ? _mm256_fmadd_ps(y, _mm256_set1_ps(ascale[r]), _mm256_loadu_ps(bias + 8 * h))  \
             : _mm256_mul_ps(y, _mm256_set1_ps(ascale[r]));                                  \
    if (gelu) y = gelu8(y);                                                                  \
    if (add) y = _mm256_add_ps(y, _mm256_loadu_ps(add + (r) * ldc + 8 * h));                 \
    _mm256_storeu_ps(c + (r) * ldc + 8 * h, y);                                              \
  }
#define STORE(r)   \
  if (R > r) {     \
    FINISH(r, 0)   \
    FINISH(r, 1)   \
  }
#define BLOCK(NAME, STEPPER, R_)                                                             \
  static void NAME##R_(const uint8_t *u, int64_t kp, const float *ascale,                    \
                        const int8_t *panel, const int32_t *corr, const float *wscale,       \
                        const float *bias, int gelu, const float *add, float *c, int64_t ldc, \
                        const int8_t *ahead) {                                               \
    enum { R = R_ };                                                                         \
    const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);                  \
    (void)ones; /* (VPMADDWD's, unused by VPDPBUSD) */                                       \
    __m256i s00 = z, s01 = z, s10 = z, s11 = z, s20 = z, s21 = z, s30 = z, s31 = z;          \
    __m256i s40 = z, s41 = z, s50 = z, s51 = z;                                              \
    for (int64_t g = 0; g < kp / 4; g++) {                                                   \
      __m256i w0 = _mm256_loadu_si256((const __m256i *)(panel + g * GROUP));                 \
      __m256i w1 = _mm256_loadu_si256((const __m256i *)(panel + g * GROUP + 32));            \
      if (ahead) _mm_prefetch((const char *)(ahead + g * GROUP), _MM_HINT_T1);               \
      STEPPER(0) STEPPER(1) STEPPER(2) STEPPER(3) STEPPER(4) STEPPER(5)                     \
    }                                                                                        \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)                                    \
  }
BLOCK(block, STEP, 1) BLOCK(block, STEP, 2) BLOCK(block, STEP, 3)
BLOCK(block, STEP, 4) BLOCK(block, STEP, 5) BLOCK(block, STEP, 6)

/* With VNNI one VPDPBUSD does the work of VPMADDUBSW, VPMADDWD and VPADDD, summing the 4 u8 x s8
   products of each column straight into 32 bits: nothing saturates, so the activations keep 8
   bits (levels up to 127, shifted to 1..255). Compiled for AVX512-VNNI and AVX512-VL (its
   256-bit form) in these functions only, and called only where the CPU has both (qgemm checks). */
#define STEP_VNNI(r)                                                         \
  if (R > r) {                                                               \
    __m256i x = _mm256_set1_epi32(*(const int32_t *)(u + (r) * kp + 4 * g)); \
    s##r##0 = _mm256_dpbusd_epi32(s##r##0, x, w0);                          \
    s##r##1 = _mm256_dpbusd_epi32(s##r##1, x, w1);                          \
  }
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512vnni")
BLOCK(vnni, STEP_VNNI, 1) BLOCK(vnni, STEP_VNNI, 2) BLOCK(vnni, STEP_VNNI, 3)
BLOCK(vnni, STEP_VNNI, 4) BLOCK(vnni, STEP_VNNI, 5) BLOCK(vnni, STEP_VNNI, 6)

/* With VNNI a full panel takes wide blocks: up to 10 rows (WIDE_ROWS), a row's 16 sums in one
   512-bit register, each step of 4 inputs one panel load, and a broadcast and one VPDPBUSD a
   row (against the 256-bit blocks' two). Each row's sums are those of the 256-bit blocks, and
   are finished on their two halves by the same FINISH: the same bits. */
#define WIDE_ROWS 10
#define WSTEP(r)                                                                           \
  if (R > r)                                                                               \
    t##r = _mm512_dpbusd_epi32(t##r, _mm512_set1_epi32(*(const int32_t *)(u + (r) * kp + 4 * g)), \
                               w);
#define WSTORE(r)                                                 \
  if (R > r) {                                                    \
    const __m256i s##r##0 = _mm512_castsi512_si256(t##r);         \
    const __m256i s##r##1 = _mm512_extracti64x4_epi64(t##r, 1);   \
    FINISH(r, 0)                                                  \
    FINISH(r, 1)                                                  \
  }
#define WIDE(R_)                                                                               \
  static void wide##R_(const uint8_t *u, int64_t kp, const float *ascale, const int8_t *panel, \
                       const int32_t *corr, const float *wscale, const float *bias, int gelu,  \
                       const float *add, float *c, int64_t ldc, const int8_t *ahead) {        \
    enum { R = R_ };                                                                           \
    const __m512i z = _mm512_setzero_si512();                                                  \
    __m512i t0 = z, t1 = z, t2 = z, t3 = z, t4 = z, t5 = z, t6 = z, t7 = z, t8 = z, t9 = z;    \
    for (int64_t g = 0; g < kp / 4; g++) {                                                     \
      const __m512i w = _mm512_loadu_si512((const void *)(panel + g * GROUP));                 \
      if (ahead) _mm_prefetch((const char *)(ahead + g * GROUP), _MM_HINT_T1);                 \
      WSTEP(0) WSTEP(1) WSTEP(2) WSTEP(3) WSTEP(4) WSTEP(5) WSTEP(6) WSTEP(7) WSTEP(8)         \
      WSTEP(9)                                                                                 \
    }                                                                                          \
    WSTORE(0) WSTORE(1) WSTORE(2) WSTORE(3) WSTORE(4) WSTORE(5) WSTORE(6) WSTORE(7)            \
    WSTORE(8) WSTORE(9)                                                                        \
  }
WIDE(1) WIDE(2) WIDE(3) WIDE(4) WIDE(5) WIDE(6) WIDE(7) WIDE(8) WIDE(9) WIDE(10)
#pragma GCC pop_options

/* A block of `rows` rows (1 to 6): each size is its own function, its sums in registers. */
typedef void (*block_fn)(const uint8_t *, int64_t, const float *, const int8_t *, const int32_t *,
                         const float *, const float *, int, const float *, float *, int64_t,
                         const int8_t *);
static const block_fn PLAIN[ROWS] = {block1, block2, block3, block4, block5, block6};
static const block_fn WITH_VNNI[ROWS] = {vnni1, vnni2, vnni3, vnni4, vnni5, vnni6};
static const block_fn WIDE_VNNI[WIDE_ROWS] = {wide1, wide2, wide3, wide4, wide5,
                                              wide6, wide7, wide8, wide9, wide10};

static void block(int vnni, int rows, const uint8_t *u, int64_t kp, const float *ascale,
                  const int8_t *panel, const int32_t *corr, const float *wscale,
                  const float *bias, int gelu, const float *add, float *c, int64_t ldc,
                  const int8_t *ahead) {
  (vnni ? WITH_VNNI : PLAIN)[rows - 1](u, kp, ascale, panel, corr, wscale, bias, gelu, add, c, ldc,
                                       ahead);
}

/* The last panel of an n that is not a multiple of 16: the block (up to 6 rows, with VNNI too)
   computed into a 6 x 16 scratch (its corrections, scales, bias and add read through
   zero-padded copies), then its first `cols` columns copied out. */
static void partial(int vnni, int rows, int cols, const uint8_t *u, int64_t kp,
                    const float *ascale, const int8_t *panel, const int32_t *corr,
                    const float *wscale, const float *bias, int gelu, const float *add,
                    float *c, int64_t ldc) {
  float out[ROWS * PANEL], plus[ROWS * PANEL] = {0}, b[PANEL] = {0}, ws[PANEL] = {0};
  int32_t cr[PANEL] = {0};
  for (int j = 0; j < cols; j++) {
    b[j] = bias ? bias[j] : 0.f;
    ws[j] = wscale[j];
    cr[j] = corr[j];
  }
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < PANEL; j++) plus[r * PANEL + j] = add && j < cols ? add[r * ldc + j] : 0.f;
  block(vnni, rows, u, kp, ascale, panel, cr, ws, b, gelu, add ? plus : 0, out, PANEL, 0);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols; j++) c[r * ldc + j] = out[r * PANEL + j];
}

/* The rounding alone, for oneDNN's signed int8 product (precision.py's onednn-s8): each row r
   of a (m, k) to q = round(t / s) in -L..L as signed bytes (q: m x k), with t = a * unsmooth
   and s = max(max|t| / L, the smallest normal float) in scale[r], the numbers of precision.py's
   _quantize_rows, bit for bit, in one pass instead of its seven. Returns 0, or -1 (nothing
   read or written) where levels is outside 1..127. */
int bertlab_quantize(const float *a, int64_t m, int64_t k, const float *unsmooth, int levels,
                     int8_t *q, float *scale, int threads) {
  if (levels < 1 || levels > 127) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if (m * k >= 65536)
  for (int64_t r = 0; r < m; r++) {
    const float *row = a + r * k;
    int8_t *out = q + r * k;
    const float s = row_scale(row, k, unsmooth, levels);
    scale[r] = s;
    const __m256 vs = _mm256_set1_ps(s);
    int64_t j;
    for (j = 0; j + 8 <= k; j += 8) {
      __m256 t = _mm256_loadu_ps(row + j);
      if (unsmooth) t = _mm256_mul_ps(t, _mm256_loadu_ps(unsmooth + j));
      __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(t, vs)); /* (halves to even, as torch.round) */
      __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64((__m128i *)(out + j), _mm_packs_epi16(w16, w16));
    }
    for (; j < k; j++) out[j] = (int8_t)nearbyintf((unsmooth ? row[j] * unsmooth[j] : row[j]) / s);
  }
  return 0;
}

/* Back from oneDNN's int32 sums of the rows bertlab_quantize rounded (acc: m x n, row-major):
   c = norm(acc wscale ascale[r] + bias (+ add)), norm a layer norm of each row (n a multiple of
   8) or none, in one pass. (No GELU: where oneDNN's s8 kernel runs, PyTorch's is AVX-512.) */
void bertlab_dequantize(const int32_t *acc, int64_t m, int64_t n, const float *ascale,
                        const float *wscale, const float *bias, const float *add,
                        const float *lnw, const float *lnb, float eps, float *c, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (m * n >= 16384)
  for (int64_t r = 0; r < m; r++) {
    const __m256 s = _mm256_set1_ps(ascale[r]);
    const int32_t *in = acc + r * n;
    const float *plus = add ? add + r * n : 0;
    float *out = c + r * n;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 v = _mm256_mul_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(in + j))),
                        _mm256_loadu_ps(wscale + j)),
          s);
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
      if (plus) v = _mm256_add_ps(v, _mm256_loadu_ps(plus + j));
      _mm256_storeu_ps(out + j, v);
    }
    if (j < n) { /* the last columns, through 8-lane buffers */
      const int64_t w = n - j;
      int32_t sums[8] = {0};
      float ws[8] = {0}, b[8] = {0}, more[8] = {0}, y[8];
      memcpy(sums, in + j, w * sizeof(int32_t));
      memcpy(ws, wscale + j, w * sizeof(float));
      if (bias) memcpy(b, bias + j, w * sizeof(float));
      if (plus) memcpy(more, plus + j, w * sizeof(float));
      __m256 v = _mm256_mul_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)sums)),
                        _mm256_loadu_ps(ws)),
          s);
      v = _mm256_add_ps(_mm256_add_ps(v, _mm256_loadu_ps(b)), _mm256_loadu_ps(more));
      _mm256_storeu_ps(y, v);
      memcpy(out + j, y, w * sizeof(float));
    }
    if (lnw) layer_norm_row(out, n, lnw, lnb, eps);
  }
}

/* vnni: sum with VPDPBUSD (levels 1..127), else with VPMADDUBSW (levels 1..63). Returns 0, or
   -1 (nothing read or written) where levels is outside those, or -2 where vnni is asked of a
   CPU without AVX512-VNNI and AVX512-VL. */
int bertlab_qgemm(const float *a, int64_t m, int64_t k, const float *unsmooth, int levels,
                  int vnni, const int8_t *panels, const int32_t *corr, const float *wscale,
                  int64_t n, const float *bias, int gelu, const float *add, const float *lnw,
                  const float *lnb, float eps, float *c, uint8_t *qa, float *ascale,
                  int threads) {
  if (levels < 1 || levels > (vnni ? 127 : 63)) return -1;
  if (vnni && !(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")))
    return -2;
  const int64_t kp = (k + 3) / 4 * 4, count = (n + PANEL - 1) / PANEL;
  struct bertlab_team team;
  bertlab_team_begin(&team, threads, m);
#pragma omp parallel num_threads(team.size)
  {
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < m; r++)
      quantize(a + r * k, k, unsmooth, levels, qa + r * kp, kp, ascale + r);
    BERTLAB_WAIT(team); /* every row is rounded before any panel reads it */
#pragma omp for schedule(static) nowait
    for (int64_t p = 0; p < count; p++) {
      const int8_t *panel = panels + p * kp * PANEL;
      const int64_t col = p * PANEL;
      const int cols = n - col < PANEL ? (int)(n - col) : PANEL;
      const int8_t *next = p + 1 < count ? panel + kp * PANEL : 0;
      const int64_t most = vnni && cols == PANEL ? WIDE_ROWS : ROWS; /* (partial: 6) */
      const int64_t blocks = (m + most - 1) / most; /* (as evenly as sgemm_avx2.c's) */
      for (int64_t b = 0, row = 0, rows; b < blocks; b++, row += rows) {
        rows = (m - row) / (blocks - b);
        const float *plus = add ? add + row * n + col : 0;
        if (cols == PANEL)
          (vnni ? WIDE_VNNI : PLAIN)[rows - 1](qa + row * kp, kp, ascale + row, panel,
                                               corr + col, wscale + col, bias ? bias + col : 0,
                                               gelu, plus, c + row * n + col, n,
                                               b == (blocks > 1) ? next : 0);
        else
          partial(vnni, rows, cols, qa + row * kp, kp, ascale + row, panel, corr + col,
                  wscale + col, bias ? bias + col : 0, gelu, plus, c + row * n + col, n);
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
