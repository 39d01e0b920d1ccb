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

/* GELU with erf, x (1 + erf(x / sqrt 2)) / 2, as PyTorch's exact form: erfc(|u|) for u = x / sqrt 2
   is t e^(-u^2 + P(t)), t = 1 / (1 + |u| / 2), P Numerical Recipes' degree-9 Chebyshev fit
   (relative error under 1.2e-7 for every u). With h = erfc(|u|) / 2, GELU is x (1 - h) for
   x >= 0 and x h below. */
static inline __m256 gelu8(__m256 x) {
  const __m256 u = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  const __m256 z = _mm256_andnot_ps(_mm256_set1_ps(-0.f), u); /* |u| */
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(z, _mm256_set1_ps(0.5f), one));
  __m256 p = _mm256_set1_ps(0.17087277f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
  p = _mm256_fnmadd_ps(z, z, p); /* -u^2 + P(t) */
  const __m256 h = _mm256_mul_ps(_mm256_mul_ps(t, exp8(p)), _mm256_set1_ps(0.5f));
  const __m256 positive = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_mul_ps(x, _mm256_blendv_ps(h, _mm256_sub_ps(one, h), positive));
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
