/* Element functions of 8 floats at once for bertlab's AVX2 kernels (avx2.py builds them):
   e^x for the attention's softmax (attention_avx2.c), GELU for the products' epilogue, and the
   layer norm of a row that follows a product (sgemm_avx2.c, int8_avx2.c). */

#ifndef BERTLAB_AVX2_MATH_H
#define BERTLAB_AVX2_MATH_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

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

/* GELU with erf, x (1 + erf(x / sqrt 2)) / 2, as PyTorch's exact form: erf(u) for u = x / sqrt 2
   clamped to [-4, 4] is u P(u^2) / Q(u^2), a rational fit of degrees 13 and 8 (the one XLA and
   Eigen use for float32 erf). Below x = -5.3, where GELU is under 3.1e-7 in size, the result
   is 0: there 1 + erf(u) is the difference of two numbers near 1, and float32's rounding of
   them would be larger than the value. Within 1.5e-6 of the float64 GELU from -12 to 12 (2.6e-7
   relative at worst; tests/test_avx2.py holds it to 1e-6 plus 1.2e-7 relative), three times as
   fast as the erfc-and-exp form it replaced (about 0.38 against 1.15 ns a value on one Zen 4
   core, a scratch timing). NaN stays NaN. */
static inline __m256 gelu8(__m256 x) {
  __m256 u = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  u = _mm256_min_ps(_mm256_max_ps(u, _mm256_set1_ps(-4.f)), _mm256_set1_ps(4.f));
  const __m256 u2 = _mm256_mul_ps(u, u);
  __m256 p = _mm256_set1_ps(-2.72614225801306e-10f);
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.77068142495902e-08f));
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-2.10102402082508e-06f));
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-5.69250639462346e-05f));
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-7.34990630326855e-04f));
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-2.95459980854025e-03f));
  p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-1.60960333262415e-02f));
  __m256 q = _mm256_set1_ps(-1.45660718464996e-05f);
  q = _mm256_fmadd_ps(q, u2, _mm256_set1_ps(-2.13374055278905e-04f));
  q = _mm256_fmadd_ps(q, u2, _mm256_set1_ps(-1.68282697438203e-03f));
  q = _mm256_fmadd_ps(q, u2, _mm256_set1_ps(-7.37332916720468e-03f));
  q = _mm256_fmadd_ps(q, u2, _mm256_set1_ps(-1.42647390514189e-02f));
  const __m256 erf = _mm256_div_ps(_mm256_mul_ps(u, p), q);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 y = _mm256_mul_ps(x, _mm256_fmadd_ps(erf, half, half));
  const __m256 tail = _mm256_cmp_ps(x, _mm256_set1_ps(-5.3f), _CMP_LT_OQ); /* (false for NaN) */
  return _mm256_andnot_ps(tail, y);
}

/* Layer norm of one row of n floats in place, n a multiple of 8: y = (x - mean) / sqrt(var + eps)
   * weight + bias, the mean and the (biased) variance over the row in two passes of 8 lanes (the
   sum, then the squared deviations from the mean), each lane's partial sums added in one fixed
   order: the same bits on any thread count. */
static inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline void layer_norm_row(float *y, int64_t n, const float *weight, const float *bias,
                                  float eps) {
  __m256 s = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(y + j));
  const __m256 mean = _mm256_set1_ps(sum8(s) / (float)n);
  s = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) {
    __m256 d = _mm256_sub_ps(_mm256_loadu_ps(y + j), mean);
    s = _mm256_fmadd_ps(d, d, s);
  }
  const __m256 r = _mm256_set1_ps(1.0f / sqrtf(sum8(s) / (float)n + eps));
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(y + j), mean), r);
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(v, _mm256_loadu_ps(weight + j),
                                            _mm256_loadu_ps(bias + j)));
  }
}

#endif
