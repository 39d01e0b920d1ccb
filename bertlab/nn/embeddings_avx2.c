/* bertlab's embeddings for AVX2 CPUs: for each token, its rows of the three tables summed and
   the sum normalized, in one pass: BertEmbeddings.forward in float32 inference, where the
   policy runs bertlab's AVX2 kernels (products.embeddings says when).

   ids, types, positions  (n) int64 each, types NULL for all 0: rows of word, type and pos
   word, type, pos        (words, h), (types_count, h), (positions_count, h) float32 row-major
   lnw, lnb, eps          the layer norm (avx2_math.h: its rounding, not PyTorch's)
   out                    (n, h) float32 row-major, h a multiple of 8

   Each token's sum is (word + type) + pos, in that order, as BertEmbeddings adds them: the
   same bits as PyTorch's two additions. One call replaces seven of PyTorch's operations: at
   batch 1 each costs several times its own work, the products before it having pushed its
   code and data out of the caches (docs/performance.md). */

#include <immintrin.h>
#include <stdint.h>

#include "avx2_math.h"

/* Returns 0, or -1 without writing anything where an index is outside its table (the caller
   checks them first: this keeps a caller's mistake from reading past a table). */
int bertlab_embed(const int64_t *ids, const int64_t *types, const int64_t *positions, int64_t n,
                  int64_t h, const float *word, int64_t words, const float *type,
                  int64_t types_count, const float *pos, int64_t positions_count,
                  const float *lnw, const float *lnb, float eps, float *out, int threads) {
  for (int64_t r = 0; r < n; r++)
    if (ids[r] < 0 || ids[r] >= words || positions[r] < 0 || positions[r] >= positions_count ||
        (types && (types[r] < 0 || types[r] >= types_count)))
      return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * h >= 65536)
  for (int64_t r = 0; r < n; r++) {
    const float *w = word + ids[r] * h, *t = type + (types ? types[r] : 0) * h;
    const float *p = pos + positions[r] * h;
    float *o = out + r * h;
    for (int64_t j = 0; j < h; j += 8) {
      const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(t + j));
      _mm256_storeu_ps(o + j, _mm256_add_ps(sum, _mm256_loadu_ps(p + j)));
    }
    layer_norm_row(o, h, lnw, lnb, eps);
  }
  return 0;
}
