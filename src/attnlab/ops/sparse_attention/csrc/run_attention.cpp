// Exact softmax attention of each query row over "runs" of keys (SEA's selected cells), on CPU.
//
// A row (b, t) lists C cells; cell c belongs to query head head[c] and keeps count[c] keys of
// the width[c] ranks starting at lo[c]: slot o < count reads rank lo + floor(o * width / count)
// (lo + o when count == width), mapped to a key position through rank_to_pos[b] when given.
// Per (row, head) the softmax runs over all keys of that head's cells (online, cell by cell);
// the result is times row_scale[b, h, t]; a head with no key outputs 0.
//
// Reads K and V rows in place (a cell's keys are contiguous when count == width), so nothing
// is gathered into memory. Rows are split across OpenMP threads. No torch headers: the Python
// side (attnlab/ops/sparse_attention/native.py) passes raw pointers of contiguous tensors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline T dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename T>
void run_attention(const T* q, const T* k, const T* v, const int64_t* head, const int64_t* lo,
                   const int64_t* count, const int64_t* width, const int64_t* rank_to_pos,
                   const T* row_scale, T* out, int64_t B, int64_t H, int64_t Hk, int64_t Tq,
                   int64_t Tk, int64_t D, int64_t Dv, int64_t C, int64_t W, T scale,
                   int n_threads) {
  const int64_t group = H / Hk;
  // "No key yet" is `lowest`, not -inf, so nothing depends on infinities.
  const T none = std::numeric_limits<T>::lowest();
#pragma omp parallel num_threads(n_threads)
  {
    std::vector<T> acc(H * Dv), top(H), total(H), score(W > 0 ? W : 1);
    std::vector<int64_t> pos(W > 0 ? W : 1);
#pragma omp for schedule(dynamic, 8)
    for (int64_t row = 0; row < B * Tq; ++row) {
      const int64_t b = row / Tq, t = row % Tq;
      for (int64_t h = 0; h < H; ++h) { top[h] = none; total[h] = 0; }
      for (int64_t i = 0; i < H * Dv; ++i) acc[i] = 0;
      const int64_t base = row * C;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t n = count[base + c];
        if (n <= 0) continue;
        const int64_t h = head[base + c], w = width[base + c], start = lo[base + c];
        const int64_t kv = (b * Hk + h / group) * Tk;
        const T* qr = q + ((b * H + h) * Tq + t) * D;
        T cell_top = none;
        for (int64_t o = 0; o < n; ++o) {
          const int64_t rank = start + (n == w ? o : (o * w) / n);
          const int64_t p = rank_to_pos ? rank_to_pos[b * Tk + rank] : rank;
          pos[o] = p;
          score[o] = scale * dot(qr, k + (kv + p) * D, D);
          cell_top = score[o] > cell_top ? score[o] : cell_top;
        }
        T* a = acc.data() + h * Dv;
        if (cell_top > top[h]) {  // refer the head's running sums to the new maximum
          const T shrink = top[h] == none ? T(0) : std::exp(top[h] - cell_top);
          total[h] *= shrink;
#pragma omp simd
          for (int64_t i = 0; i < Dv; ++i) a[i] *= shrink;
          top[h] = cell_top;
        }
        for (int64_t o = 0; o < n; ++o) {
          const T p = std::exp(score[o] - top[h]);
          total[h] += p;
          const T* vr = v + (kv + pos[o]) * Dv;
#pragma omp simd
          for (int64_t i = 0; i < Dv; ++i) a[i] += p * vr[i];
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        T* o_row = out + ((b * H + h) * Tq + t) * Dv;
        const T factor = total[h] > 0
            ? (row_scale ? row_scale[(b * H + h) * Tq + t] : T(1)) / total[h] : T(0);
        const T* a = acc.data() + h * Dv;
        for (int64_t i = 0; i < Dv; ++i) o_row[i] = a[i] * factor;
      }
    }
  }
}

}  // namespace

extern "C" {

#define ATTNLAB_RUN_ATTENTION(NAME, T)                                                        \
  void NAME(const T* q, const T* k, const T* v, const int64_t* head, const int64_t* lo,       \
            const int64_t* count, const int64_t* width, const int64_t* rank_to_pos,           \
            const T* row_scale, T* out, int64_t B, int64_t H, int64_t Hk, int64_t Tq,         \
            int64_t Tk, int64_t D, int64_t Dv, int64_t C, int64_t W, double scale,           \
            int n_threads) {                                                                  \
    run_attention<T>(q, k, v, head, lo, count, width, rank_to_pos, row_scale, out, B, H, Hk, \
                     Tq, Tk, D, Dv, C, W, static_cast<T>(scale), n_threads);                 \
  }

ATTNLAB_RUN_ATTENTION(attnlab_run_attention_f32, float)
ATTNLAB_RUN_ATTENTION(attnlab_run_attention_f64, double)

}  // extern "C"
