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
#include <stdint.h>
#include <omp.h>

/* e^x for 8 floats at once, x <= 88: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' degree-7
   polynomial (about 1 ulp), times 2^n written into the exponent. Below -87.3 (where e^x is under
   the smallest normal float) the result is 2^-126 at most: nothing against the row's largest
   term, which is 1. */
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* One head of one sequence: t queries over the same t keys. The keys are copied transposed
   (d x t) so that a query's scores come 8 keys at a time: the sums for 32 keys stay in 4
   registers while the query's d values are broadcast. The weighted sum of values keeps 32 of
   the query's d outputs in registers at a time (d a multiple of 8) while the values stream
   past. */
static void one_head(const float *restrict q, int64_t ldq, const float *restrict k, int64_t ldk,
                     const float *restrict v, int64_t ldv, float *restrict out, int64_t ldo,
                     int64_t t, int64_t d, float scale, float *restrict kt, float *restrict s) {
  const int64_t tp = (t + 31) / 32 * 32; /* kt's row length: keys padded with zeros to 32 */
  for (int64_t e = 0; e < d; e++) {
    for (int64_t j = 0; j < t; j++) kt[e * tp + j] = k[j * ldk + e];
    for (int64_t j = t; j < tp; j++) kt[e * tp + j] = 0.f;
  }
  for (int64_t i = 0; i < t; i++) {
    const float *qi = q + i * ldq;
    for (int64_t j = 0; j < tp; j += 32) { /* s[j..j+32) = q_i . k_j.. */
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t e = 0; e < d; e++) {
        const __m256 x = _mm256_broadcast_ss(qi + e);
        const float *row = kt + e * tp + j;
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 8), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 16), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 24), a3);
      }
      const __m256 c = _mm256_set1_ps(scale);
      _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, c));
      _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(a1, c));
      _mm256_storeu_ps(s + j + 16, _mm256_mul_ps(a2, c));
      _mm256_storeu_ps(s + j + 24, _mm256_mul_ps(a3, c));
    }
    float top = s[0];
    for (int64_t j = 1; j < t; j++) top = s[j] > top ? s[j] : top;
    int64_t j = 0;
    for (; j + 8 <= t; j += 8)
      _mm256_storeu_ps(s + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(top))));
    for (; j < t; j++) s[j] = expf(s[j] - top);
    float sum = 0.f;
    for (j = 0; j < t; j++) sum += s[j];
    const __m256 inv = _mm256_set1_ps(1.f / sum);
    float *oi = out + i * ldo;
    for (int64_t e = 0; e < d; e += 32) { /* out_i[e..e+32) = sum_j p_j v_j[e..e+32) / sum */
      const int64_t w = d - e < 32 ? d - e : 32;
      __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
      for (int64_t jj = 0; jj < t; jj++) {
        const __m256 p = _mm256_broadcast_ss(s + jj);
        const float *vj = v + jj * ldv + e;
        o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj), o0);
        if (w > 8) o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8), o1);
        if (w > 16) o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 16), o2);
        if (w > 24) o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 24), o3);
      }
      _mm256_storeu_ps(oi + e, _mm256_mul_ps(o0, inv));
      if (w > 8) _mm256_storeu_ps(oi + e + 8, _mm256_mul_ps(o1, inv));
      if (w > 16) _mm256_storeu_ps(oi + e + 16, _mm256_mul_ps(o2, inv));
      if (w > 24) _mm256_storeu_ps(oi + e + 24, _mm256_mul_ps(o3, inv));
    }
  }
}

/* longest: the longest sequence's length; scratch: threads x (d + 1) x (longest rounded up to
   32) floats, each thread's keys transposed and its scores. */
void bertlab_attention(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                       int64_t ldv, float *out, int64_t ldo, const int32_t *starts, int64_t count,
                       int64_t longest, int64_t heads, int64_t d, float scale, float *scratch,
                       int threads) {
  const int64_t tp = (longest + 31) / 32 * 32;
#pragma omp parallel num_threads(threads)
  {
    float *kt = scratch + omp_get_thread_num() * (d + 1) * tp;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < count * heads; task++) {
      const int64_t b = task / heads, h = task % heads, first = starts[b];
      one_head(q + first * ldq + h * d, ldq, k + first * ldk + h * d, ldk, v + first * ldv + h * d,
               ldv, out + first * ldo + h * d, ldo, starts[b + 1] - first, d, scale, kt,
               kt + tp * d);
    }
  }
}
