/* bertlab's attention for short sequences on AVX2 CPUs: softmax(q k^T * scale) v, each
   sequence of a packed batch over its own tokens only, every head on its own.

   Built and loaded with the float32 product (avx2.py), which says when it is used and why
   (attention.py's packed kernel calls it).

   q, k, v  rows of a packed batch: row r of head h is q + r * ldq + h * d (and so for k and v):
            the query, key and value projections, views of one product's output
   out      (rows, heads * d) row-major, ldo floats a row
   starts   (count + 1) int32: sequence b is rows starts[b] .. starts[b + 1]

   Each thread takes whole (sequence, head) pairs. For each query the scores of all keys are
   computed, then their softmax (the largest score subtracted first, as every softmax kernel
   does), then the weighted sum of the values, divided by the sum of the weights at the end.
   A query's result depends on its own sequence alone, and on no thread count. */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "avx2_math.h"
#include "team.h"

/* The scores of R queries (1 or 2) against W registers of 8 keys (1 to 4) from key j:
   s_r[j..j+8W) = q_r . k * scale, W x R sums in registers while the queries' d values are
   broadcast against the transposed keys kt (d rows of tp floats). R and W are constants where
   it is called, so each (R, W) is its own unrolled loop. */
static inline __attribute__((always_inline)) void scores(
    const int R, const int W, const float *restrict q, int64_t ldq, const float *restrict kt,
    int64_t tp, int64_t j, int64_t d, float scale, float *restrict s) {
  const __m256 z = _mm256_setzero_ps();
  __m256 a[2][4] = {{z, z, z, z}, {z, z, z, z}};
  for (int64_t e = 0; e < d; e++) {
    const float *row = kt + e * tp + j;
    __m256 k[4];
    for (int c = 0; c < W; c++) k[c] = _mm256_loadu_ps(row + 8 * c);
    for (int r = 0; r < R; r++) {
      const __m256 x = _mm256_broadcast_ss(q + r * ldq + e);
      for (int c = 0; c < W; c++) a[r][c] = _mm256_fmadd_ps(x, k[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < W; c++)
      _mm256_storeu_ps(s + r * tp + j + 8 * c, _mm256_mul_ps(a[r][c], _mm256_set1_ps(scale)));
}

/* R queries (1 or 2) of one head, rows q, q + ldq, over the t keys: their scores, 32 keys at a
   time (fewer in the last registers, tp being t rounded up to 8), softmax and weighted sums of
   values. The weighted sums keep 32 of each query's d outputs in registers at a time (d a
   multiple of 8) while the values stream past. With R = 2 every key and value loaded serves two
   queries. */
static inline __attribute__((always_inline)) void queries(
    const int R, const float *restrict q, int64_t ldq, const float *restrict kt, int64_t tp,
    const float *restrict v, int64_t ldv, float *restrict out, int64_t ldo, int64_t t, int64_t d,
    float scale, float *restrict s) {
  const __m256 z = _mm256_setzero_ps();
  for (int64_t j = 0; j < tp; j += 32) {
    const int64_t w = tp - j < 32 ? (tp - j) / 8 : 4; /* registers of keys: 1 to 4 */
    if (w == 4) scores(R, 4, q, ldq, kt, tp, j, d, scale, s);
    else if (w == 3) scores(R, 3, q, ldq, kt, tp, j, d, scale, s);
    else if (w == 2) scores(R, 2, q, ldq, kt, tp, j, d, scale, s);
    else scores(R, 1, q, ldq, kt, tp, j, d, scale, s);
  }
  __m256 inv[2];
  for (int r = 0; r < R; r++) { /* s_r = e^(s_r - max s_r); inv = 1 / sum s_r */
    float *sr = s + r * tp, top = sr[0], sum = 0.f;
    const int64_t whole = t / 8 * 8; /* keys in whole registers of 8; the rest one by one */
    if (whole) {
      __m256 m = _mm256_loadu_ps(sr);
      for (int64_t j = 8; j < whole; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(sr + j));
      float lanes[8];
      _mm256_storeu_ps(lanes, m);
      for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    }
    for (int64_t j = whole; j < t; j++) top = sr[j] > top ? sr[j] : top;
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += 8) {
      const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), _mm256_set1_ps(top)));
      _mm256_storeu_ps(sr + j, p);
      total = _mm256_add_ps(total, p);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, total);
    for (int l = 0; l < 8; l++) sum += lanes[l];
    for (int64_t j = whole; j < t; j++) sum += sr[j] = expf(sr[j] - top);
    inv[r] = _mm256_set1_ps(1.f / sum);
  }
  for (int64_t e = 0; e < d; e += 32) { /* out_r[e..e+32) = sum_j s_r[j] v_j[e..e+32) * inv */
    const int w = d - e < 32 ? (int)(d - e) / 8 : 4; /* registers of outputs: 1 to 4 */
    __m256 o[2][4] = {{z, z, z, z}, {z, z, z, z}};
    for (int64_t j = 0; j < t; j++) {
      const float *vj = v + j * ldv + e;
      for (int r = 0; r < R; r++) {
        const __m256 p = _mm256_broadcast_ss(s + r * tp + j);
        for (int c = 0; c < 4; c++)
          if (c < w) o[r][c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * c), o[r][c]);
      }
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < w; c++)
        _mm256_storeu_ps(out + r * ldo + e + 8 * c, _mm256_mul_ps(o[r][c], inv[r]));
  }
}

/* One head of one sequence: t queries over the same t keys, two queries at a time. The keys
   are first copied transposed into kt (d x tp, zeros past t), so that scores come 8 keys to a
   register; s holds two rows of tp scores. tp is t rounded up to 8, not 32, so that 21 keys
   take 24 keys' work (queries leaves out the registers of keys past tp). */
static void one_head(const float *restrict q, int64_t ldq, const float *restrict k, int64_t ldk,
                     const float *restrict v, int64_t ldv, float *restrict out, int64_t ldo,
                     int64_t t, int64_t d, float scale, float *restrict kt, float *restrict s) {
  const int64_t tp = (t + 7) / 8 * 8; /* kt's row length: keys padded with zeros to 8 */
  for (int64_t e = 0; e < d; e++) {
    for (int64_t j = 0; j < t; j++) kt[e * tp + j] = k[j * ldk + e];
    for (int64_t j = t; j < tp; j++) kt[e * tp + j] = 0.f;
  }
  int64_t i = 0;
  for (; i + 2 <= t; i += 2)
    queries(2, q + i * ldq, ldq, kt, tp, v, ldv, out + i * ldo, ldo, t, d, scale, s);
  if (i < t) queries(1, q + i * ldq, ldq, kt, tp, v, ldv, out + i * ldo, ldo, t, d, scale, s);
}

/* rows: the rows of q, k, v and out; longest: the longest sequence's length; scratch: threads x
   (d + 2) x (longest rounded up to 32) floats, each thread's keys transposed and two rows of
   scores. Returns 0, or -1 without touching memory where starts does not rise from 0 to rows
   in steps of at most longest (the caller's error, which would read and write past its
   tensors). */
int bertlab_attention(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                      int64_t ldv, float *out, int64_t ldo, const int32_t *starts, int64_t count,
                      int64_t rows, int64_t longest, int64_t heads, int64_t d, float scale,
                      float *scratch, int threads) {
  if (starts[0] != 0 || starts[count] != rows) return -1;
  for (int64_t b = 0; b < count; b++)
    if (starts[b + 1] < starts[b] || starts[b + 1] - starts[b] > longest) return -1;
  const int64_t tp = (longest + 31) / 32 * 32;
  struct bertlab_team team;
  bertlab_team_begin(&team, threads, rows);
#pragma omp parallel num_threads(team.size)
  {
    float *kt = scratch + omp_get_thread_num() * (d + 2) * tp;
#pragma omp for schedule(dynamic) nowait
    for (int64_t task = 0; task < count * heads; task++) {
      const int64_t b = task / heads, h = task % heads, first = starts[b];
      one_head(q + first * ldq + h * d, ldq, k + first * ldk + h * d, ldk, v + first * ldv + h * d,
               ldv, out + first * ldo + h * d, ldo, starts[b + 1] - first, d, scale, kt,
               kt + tp * d);
    }
    BERTLAB_WAIT(team);
  }
  bertlab_team_end(&team);
  return 0;
}
