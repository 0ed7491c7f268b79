// Exact softmax attention of each query row over "runs" of keys (SEA's selected cells), on CPU.
//
// A row (b, t) lists C cells; cell c belongs to query head head[c] and keeps count[c] keys of
// the width[c] ranks starting at lo[c]: slot o < count reads rank lo + floor(o * width / count)
// (lo + o when count == width), mapped to a key position through rank_to_pos[b] when given.
// Per (row, head) the softmax runs over all keys of that head's cells (online, cell by cell);
// the result is times row_scale[b, h, t]; a head with no key outputs 0. With slopes given, each
// score gets ALiBi's linear distance penalty -slopes[h] * (q_pos[t] - k_pos[key]) (|distance|
// when symmetric) before the softmax.
//
// Three entry points share that per-row attention:
// * run_attention: the runs are given (head, lo, count, width per cell);
// * page_attention: a page selector's step (Quest, block top-k, SEA's page estimator): page
//   logits from kept page features, the group's selection and the attention in one pass;
// * select_attention: SEA's grouped top-k picks them from a ranking of the compressed cells
//   [B, H, Tq, K] (see attnlab/ops/sea/mask.py): the row's budget of cells of the highest
//   non-negative ranking across heads, each bin b covering ranks [edge(b), edge(b + 1)),
//   edge(b) = round_half_away(b * L / K), thinned to at most `cap` keys.
//
// Reads K and V rows in place (a cell's keys are contiguous when count == width), so nothing
// is gathered into memory (except that a long page prefill may score its keys from a
// transposed copy the caller provides: see page_attention). K and V may be strided views
// (e.g. the filled part of a reserved KV cache): ks / vs give their batch, head and token
// strides; a row of D values is contiguous. q, k, v and the output are float32, float64 or
// bfloat16 (stored as its 16 bits; scores, softmax and sums then run in float32). Rows are
// split across OpenMP threads. No torch headers: the Python side
// (attnlab/ops/sparse_attention/native.py) passes raw pointers of contiguous tensors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

struct bf16 {
  uint16_t bits;
};

inline float widen(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }

inline void store(bf16* d, float f) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  d->bits = std::isnan(f) ? uint16_t(0x7FC0) : uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
inline void store(float* d, float f) { *d = f; }
inline void store(double* d, double f) { *d = f; }

// exp(x) for x <= 0 in float: 2^(x log2 e) split into 2^integer (the exponent bits) times a
// degree-6 polynomial of 2^fraction (relative error below 3e-7, under float32's own rounding
// of the scores), so the loop over a run's scores vectorises; double keeps std::exp.
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  const float whole = std::floor(t), f = t - whole;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(whole) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

template <typename C, typename S>
inline C dot(const C* __restrict a, const S* __restrict b, int64_t n) {
  C acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * widen(b[i]);
  return acc;
}

// scale * (a . b0, ..., a . b3) into out[0..3]: four independent accumulators keep the FMA
// units busy
template <typename C, typename S>
inline void dot4(const C* __restrict a, const S* b0, const S* b1, const S* b2, const S* b3,
                 int64_t n, C scale, C* out) {
  C a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
  for (int64_t i = 0; i < n; ++i) {
    const C x = a[i];
    a0 += x * widen(b0[i]);
    a1 += x * widen(b1[i]);
    a2 += x * widen(b2[i]);
    a3 += x * widen(b3[i]);
  }
  out[0] = scale * a0;
  out[1] = scale * a1;
  out[2] = scale * a2;
  out[3] = scale * a3;
}

// What the entry points read: the tensors (stored as S, computed in C) and their shapes.
template <typename S, typename C>
struct Inputs {
  const S* q;
  const S* k;
  const S* v;
  const int64_t* rank_to_pos;
  const C* row_scale;
  S* out;
  const int64_t* ks;
  const int64_t* vs;
  int64_t B, H, Hk, Tq, Tk, D, Dv;
  C scale;
  const C* slopes;  // [H], or null: no distance penalty
  const C* q_pos;   // [Tq]
  const C* k_pos;   // [Tk]
  int symmetric;

  // the position of sequence b's key of rank `rank` among its real keys
  int64_t position(int64_t b, int64_t rank) const {
    return rank_to_pos ? rank_to_pos[b * Tk + rank] : rank;
  }
};

// Online softmax of one query row over runs of keys, per head (scratch reused across rows).
template <typename S, typename T>
class RowAttention {
 public:
  RowAttention(const Inputs<S, T>& in, int64_t max_width)
      : in_(in), acc_(in.H * in.Dv), top_(in.H), total_(in.H), q_(in.H * in.D),
        widened_(in.H), score_(std::max<int64_t>(max_width, 1)),
        pos_(std::max<int64_t>(max_width, 1)) {}

  void begin(int64_t b, int64_t t) {
    b_ = b;
    t_ = t;
    std::fill(widened_.begin(), widened_.end(), 0);
    std::fill(top_.begin(), top_.end(), none());
    std::fill(total_.begin(), total_.end(), T(0));
    std::fill(acc_.begin(), acc_.end(), T(0));
  }

  // room for n key positions; the caller fills positions()[0, n) and calls attend
  int64_t* positions(int64_t n) {
    if (n > static_cast<int64_t>(pos_.size())) pos_.resize(n);
    return pos_.data();
  }

  // n keys of the w ranks from `start`, attended by query head h
  void add_run(int64_t h, int64_t start, int64_t n, int64_t w) {
    if (n <= 0) return;
    int64_t* pos = positions(n);
    for (int64_t o = 0; o < n; ++o) {
      const int64_t rank = start + (n == w ? o : (o * w) / n);
      pos[o] = in_.position(b_, rank);
    }
    attend(h, h + 1, n);
  }

  // The keys at positions()[0, n) (key positions, not ranks), attended by query heads
  // [h_lo, h_hi) of one KV head: each key row is loaded once for all of them.
  void attend(int64_t h_lo, int64_t h_hi, int64_t n) {
    if (n <= 0) return;
    const Inputs<S, T>& in = in_;
    T* score = scores_of(h_lo, h_hi, n);
    const S* kh = in.k + b_ * in.ks[0] + h_lo / (in.H / in.Hk) * in.ks[1];
    const int64_t* pos = pos_.data();
    // four keys at a time, every head per four keys (score row j: head h_lo + j)
    int64_t o = 0;
    for (; o + 4 <= n; o += 4) {
      const S* k0 = kh + pos[o] * in.ks[2];
      const S* k1 = kh + pos[o + 1] * in.ks[2];
      const S* k2 = kh + pos[o + 2] * in.ks[2];
      const S* k3 = kh + pos[o + 3] * in.ks[2];
      for (int64_t j = h_lo; j < h_hi; ++j)
        dot4(q_.data() + j * in.D, k0, k1, k2, k3, in.D, in.scale, score + (j - h_lo) * n + o);
    }
    for (; o < n; ++o)
      for (int64_t j = h_lo; j < h_hi; ++j)
        score[(j - h_lo) * n + o] =
            in.scale * dot(q_.data() + j * in.D, kh + pos[o] * in.ks[2], in.D);
    softmax_and_values(h_lo, h_hi, n);
  }

  // As attend, with the scores from keys transposed per page: kt [pages, D, page] of this
  // row's sequence and KV head; the keys at positions()[0, n) are the first counts[i] keys of
  // pages[i], in that order. A page's scores are then `page` lanes of one product per query
  // head, with no horizontal sum per key.
  void attend_pages(int64_t h_lo, int64_t h_hi, const S* kt, int64_t page,
                    const int64_t* pages, const int64_t* counts, int64_t n_pages, int64_t n) {
    if (n <= 0) return;
    const Inputs<S, T>& in = in_;
    T* score = scores_of(h_lo, h_hi, n);
    for (int64_t j = h_lo; j < h_hi; ++j) {
      T* out = score + (j - h_lo) * n;
      for (int64_t i = 0; i < n_pages; ++i) {
        const S* tile = kt + pages[i] * in.D * page;
        const T* q = q_.data() + j * in.D;
        switch (page) {  // the common page sizes keep their lanes in registers
          case 4: page_scores<4>(q, tile, in.D, in.scale, counts[i], out); break;
          case 8: page_scores<8>(q, tile, in.D, in.scale, counts[i], out); break;
          case 16: page_scores<16>(q, tile, in.D, in.scale, counts[i], out); break;
          default:
            for (int64_t e = 0; e < counts[i]; ++e) {
              T acc = 0;
              for (int64_t d = 0; d < in.D; ++d) acc += q[d] * widen(tile[d * page + e]);
              out[e] = in.scale * acc;
            }
        }
        out += counts[i];
      }
    }
    softmax_and_values(h_lo, h_hi, n);
  }

  // writes heads [h_lo, h_hi) of the row (all by default)
  void finish(int64_t h_lo = 0, int64_t h_hi = -1) {
    const Inputs<S, T>& in = in_;
    if (h_hi < 0) h_hi = in.H;
    for (int64_t h = h_lo; h < h_hi; ++h) {
      const int64_t row = (b_ * in.H + h) * in.Tq + t_;
      S* o_row = in.out + row * in.Dv;
      const T factor =
          total_[h] > 0 ? (in.row_scale ? in.row_scale[row] : T(1)) / total_[h] : T(0);
      const T* a = acc_.data() + h * in.Dv;
      for (int64_t i = 0; i < in.Dv; ++i) store(o_row + i, a[i] * factor);
    }
  }

 private:
  // scale * q . k of `count` keys (lanes) of one page transposed [D, PAGE] into out
  template <int64_t PAGE>
  static void page_scores(const T* q, const S* tile, int64_t D, T scale, int64_t count, T* out) {
    T acc[PAGE] = {};
    for (int64_t d = 0; d < D; ++d) {
      const T x = q[d];
      const S* row = tile + d * PAGE;
#pragma omp simd
      for (int64_t e = 0; e < PAGE; ++e) acc[e] += x * widen(row[e]);
    }
    for (int64_t e = 0; e < count; ++e) out[e] = scale * acc[e];
  }

  // room for the scores of heads [h_lo, h_hi) over n keys, their query rows widened
  T* scores_of(int64_t h_lo, int64_t h_hi, int64_t n) {
    const Inputs<S, T>& in = in_;
    const int64_t needed = (h_hi - h_lo) * n;
    if (needed > static_cast<int64_t>(score_.size())) score_.resize(needed);
    for (int64_t h = h_lo; h < h_hi; ++h) {  // each head's query row, widened once per row
      if (widened_[h]) continue;
      const S* qr = in.q + ((b_ * in.H + h) * in.Tq + t_) * in.D;
      for (int64_t i = 0; i < in.D; ++i) q_[h * in.D + i] = widen(qr[i]);
      widened_[h] = 1;
    }
    return score_.data();
  }

  // The scores of heads [h_lo, h_hi) over the keys at positions()[0, n) into their running
  // softmax, then the values weighted.
  void softmax_and_values(int64_t h_lo, int64_t h_hi, int64_t n) {
    const Inputs<S, T>& in = in_;
    const int64_t heads = h_hi - h_lo;
    const S* vh = in.v + b_ * in.vs[0] + h_lo / (in.H / in.Hk) * in.vs[1];
    const int64_t* pos = pos_.data();
    T* score = score_.data();
    for (int64_t j = 0; j < heads; ++j) softmax_merge(h_lo + j, score + j * n, n);
    int64_t o;
    // values four keys at a time: a quarter of the accumulator loads and stores
    for (o = 0; o + 4 <= n; o += 4) {
      const S* v0 = vh + pos[o] * in.vs[2];
      const S* v1 = vh + pos[o + 1] * in.vs[2];
      const S* v2 = vh + pos[o + 2] * in.vs[2];
      const S* v3 = vh + pos[o + 3] * in.vs[2];
      for (int64_t j = 0; j < heads; ++j) {
        const T* p = score + j * n + o;
        const T p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
        T* a = acc_.data() + (h_lo + j) * in.Dv;
#pragma omp simd
        for (int64_t i = 0; i < in.Dv; ++i)
          a[i] += p0 * widen(v0[i]) + p1 * widen(v1[i]) + p2 * widen(v2[i]) + p3 * widen(v3[i]);
      }
    }
    for (; o < n; ++o) {
      const S* vr = vh + pos[o] * in.vs[2];
      for (int64_t j = 0; j < heads; ++j) {
        const T p = score[j * n + o];
        T* a = acc_.data() + (h_lo + j) * in.Dv;
#pragma omp simd
        for (int64_t i = 0; i < in.Dv; ++i) a[i] += p * widen(vr[i]);
      }
    }
  }

  // "No key yet" is `lowest`, not -inf, so nothing depends on infinities.
  static constexpr T none() { return std::numeric_limits<T>::lowest(); }

  // Head h's scores of n keys (ALiBi's penalty added) into its running softmax: the sums
  // referred to the new maximum, the scores replaced by their exp(score - maximum).
  void softmax_merge(int64_t h, T* score, int64_t n) {
    const Inputs<S, T>& in = in_;
    if (in.slopes) {
      const T slope = in.slopes[h], qp = in.q_pos[t_];
      for (int64_t o = 0; o < n; ++o) {
        const T distance = qp - in.k_pos[pos_[o]];
        score[o] -= slope * (in.symmetric ? std::abs(distance) : distance);
      }
    }
    T cell_top = none();
    for (int64_t o = 0; o < n; ++o) cell_top = score[o] > cell_top ? score[o] : cell_top;
    T* a = acc_.data() + h * in.Dv;
    if (cell_top > top_[h]) {  // refer the head's running sums to the new maximum
      const T shrink = top_[h] == none() ? T(0) : std::exp(top_[h] - cell_top);
      total_[h] *= shrink;
#pragma omp simd
      for (int64_t i = 0; i < in.Dv; ++i) a[i] *= shrink;
      top_[h] = cell_top;
    }
    const T top = top_[h];
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t o = 0; o < n; ++o) {
      score[o] = exp_nonpositive(score[o] - top);
      sum += score[o];
    }
    total_[h] += sum;
  }

  const Inputs<S, T>& in_;
  std::vector<T> acc_, top_, total_, q_;
  std::vector<char> widened_;
  std::vector<T> score_;
  std::vector<int64_t> pos_;
  int64_t b_ = 0, t_ = 0;
};

template <typename S, typename T>
void run_attention(const Inputs<S, T>& in, const int64_t* head, const int64_t* lo,
                   const int64_t* count, const int64_t* width, int64_t C, int64_t W,
                   int n_threads) {
#pragma omp parallel num_threads(n_threads)
  {
    RowAttention<S, T> row_attention(in, W);
#pragma omp for schedule(dynamic, 8)
    for (int64_t row = 0; row < in.B * in.Tq; ++row) {
      row_attention.begin(row / in.Tq, row % in.Tq);
      const int64_t base = row * C;
      for (int64_t c = 0; c < C; ++c)
        row_attention.add_run(head[base + c], lo[base + c], count[base + c], width[base + c]);
      row_attention.finish();
    }
  }
}

template <typename S, typename T>
void select_attention(const Inputs<S, T>& in, const T* ranking, const int64_t* lengths,
                      int64_t K, int64_t k_per_head, int64_t cap, int n_threads) {
  const int64_t H = in.H, cells = in.H * K;
#pragma omp parallel num_threads(n_threads)
  {
    RowAttention<S, T> row_attention(in, cap);
    std::vector<int64_t> edges(K + 1), order(cells);
    std::vector<T> value(cells);
#pragma omp for schedule(dynamic, 8)
    for (int64_t row = 0; row < in.B * in.Tq; ++row) {
      const int64_t b = row / in.Tq, t = row % in.Tq, L = lengths[row];
      row_attention.begin(b, t);
      if (L > 0) {
        for (int64_t i = 0; i <= K; ++i) edges[i] = (2 * i * L + K) / (2 * K);
        // cell_budget(L, k, K, H), at most H cells per non-empty bin count (mask.py)
        int64_t budget = (2 * H * k_per_head * K + L) / (2 * L);
        budget = std::min({std::max<int64_t>(budget, 1), cells, H * std::min(L, K)});
        int64_t n = 0;  // candidates: cells of non-negative ranking (empty bins are < 0)
        for (int64_t h = 0; h < H; ++h) {
          const T* r = ranking + ((b * H + h) * in.Tq + t) * K;
          for (int64_t bin = 0; bin < K; ++bin) {
            if (r[bin] >= 0) {
              value[h * K + bin] = r[bin];
              order[n++] = h * K + bin;
            }
          }
        }
        const int64_t keep = std::min(budget, n);
        auto higher = [&](int64_t x, int64_t y) {
          return value[x] > value[y] || (value[x] == value[y] && x < y);
        };
        if (keep < n) std::nth_element(order.begin(), order.begin() + keep, order.begin() + n,
                                       higher);
        for (int64_t c = 0; c < keep; ++c) {
          const int64_t h = order[c] / K, bin = order[c] % K;
          const int64_t lo = edges[bin], w = edges[bin + 1] - lo;
          row_attention.add_run(h, lo, std::min(w, cap), w);
        }
      }
      row_attention.finish();
    }
  }
}

// floor(log2(d + 1)) of a page distance d >= 0, at most n - 1 (PageEstimator's bucket)
inline int64_t distance_bucket(int64_t d, int64_t n) {
  const int64_t bits = 63 - __builtin_clzll(static_cast<unsigned long long>(d) + 1);
  return std::min(bits, n - 1);
}

// Moves the `keep` candidates of most mass (ties: the lower page first) to order[0, keep),
// in no particular order, among the first n of `order`. For float masses each candidate
// becomes one integer key (a non-negative float's bits order as the float does; the low
// half holds ~page, so the lower page wins a tie), which selects without branching on
// float comparisons; doubles compare directly.
template <typename T>
void keep_best(std::vector<int64_t>& order, const std::vector<T>& mass, int64_t n,
               int64_t keep, std::vector<uint64_t>& keys) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t c = 0; c < n; ++c) {
      uint32_t bits;
      std::memcpy(&bits, &mass[order[c]], sizeof bits);
      keys[c] = (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(~order[c]);
    }
    std::nth_element(keys.begin(), keys.begin() + keep, keys.begin() + n,
                     std::greater<uint64_t>());
    for (int64_t c = 0; c < keep; ++c)
      order[c] = static_cast<int64_t>(~static_cast<uint32_t>(keys[c]));
  } else {
    auto higher = [&](int64_t x, int64_t y) {
      return mass[x] > mass[y] || (mass[x] == mass[y] && x < y);
    };
    std::nth_element(order.begin(), order.begin() + keep, order.begin() + n, higher);
  }
}

// What a page selector's step needs beside the attention's inputs (see page_attention).
// The page features are stored as FS (like the keys, or bfloat16 beside float32 keys) and
// widened to T in the dot products.
template <typename FS, typename T>
struct PageScores {
  const T* qf;         // [B, H, Tq, F] query features
  const FS* feat;      // page features of KV head (Hf == Hk) or query head (Hf == H)
  const int64_t* fs;   // feat's batch, head and page strides (a row of F is contiguous)
  int64_t Hf, P, F;
  const T* bias;       // [H, n_buckets] added by page distance, or null
  int64_t n_buckets;
  const int64_t* q_rank;  // [B, Tq]: the query's rank among the real keys, -1 if padded
  const int64_t* n_real;  // [B]
  int64_t page, sink_pages, local_pages, n_top;
  int causal;
  T logit_scale;
};

// Query rows whose page logits are computed together, so that each page's features are read
// once for all of them (a prefill's rows; a decoding step has one row per sequence).
constexpr int64_t kLogitRows = 8;

// scale * q[r] . feat[p] for the pages [0, n_pages) and `rows` rows (q[r] at q + r * F) into
// out[r * out_stride + p]. Every logit comes from the same dot4 slot arithmetic (the last
// group of four repeats the last page), so a page's logit does not depend on which rows and
// pages shared its call: a decoding step selects exactly as the full pass.
template <typename T, typename FS>
void page_logits(const T* q, int64_t rows, const FS* feat, int64_t f_stride, int64_t n_pages,
                 int64_t F, T scale, T* out, int64_t out_stride) {
  T four[4];
  for (int64_t p = 0; p < n_pages; p += 4) {
    const FS* f[4];
    for (int64_t i = 0; i < 4; ++i) f[i] = feat + std::min(p + i, n_pages - 1) * f_stride;
    const int64_t m = std::min<int64_t>(4, n_pages - p);
    for (int64_t r = 0; r < rows; ++r) {
      dot4(q + r * F, f[0], f[1], f[2], f[3], F, scale, four);
      std::copy(four, four + m, out + r * out_stride + p);
    }
  }
}

// A page selector's selection and attention in one pass, per (row, KV group): each head's
// page logits logit_scale * qf[h] . feat[p] (+ bias[h, bucket(|own - p|)]) over the candidate
// pages (holding real keys, not after the query's own page when causal, not forced), a softmax
// per head summed over the group's heads, the n_top best sums kept beside the forced pages
// (the first sink_pages, and the local_pages up to the query's own); then each head of the
// group attends to the kept pages' keys (ranks below the query's own + 1 when causal).
// Work items are (kLogitRows rows, KV group): their logits first, then row by row.
// kt, when not null: room for the keys transposed per page, [B, Hk, P, D, page], zeroed; the
// keys are copied there first and scored from it (the caller passes it for a long prefill,
// whose rows read many times as many keys as there are; a step reads its keys in place).
template <typename S, typename T, typename FS>
void page_attention(const Inputs<S, T>& in, const PageScores<FS, T>& ps, S* kt,
                    int n_threads) {
  const int64_t per = in.H / in.Hk, rows = std::min(kLogitRows, in.Tq);
  const int64_t blocks = (in.Tq + rows - 1) / rows;
  if (kt) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t item = 0; item < in.B * in.Hk * ps.P; ++item) {
      const int64_t b = item / (in.Hk * ps.P), g = item / ps.P % in.Hk, p = item % ps.P;
      S* tile = kt + item * in.D * ps.page;
      const int64_t hi = std::min(ps.n_real[b], (p + 1) * ps.page);
      for (int64_t r = p * ps.page; r < hi; ++r) {
        const S* key = in.k + b * in.ks[0] + g * in.ks[1] + in.position(b, r) * in.ks[2];
        for (int64_t d = 0; d < in.D; ++d) tile[d * ps.page + r - p * ps.page] = key[d];
      }
    }
  }
  // the pages a query of rank `rank` in sequence b may read
  auto readable_of = [&](int64_t b, int64_t rank) {
    const int64_t readable = std::min((ps.n_real[b] + ps.page - 1) / ps.page, ps.P);
    return ps.causal ? std::min(readable, rank / ps.page + 1) : readable;
  };
#pragma omp parallel num_threads(n_threads)
  {
    RowAttention<S, T> row_attention(in, ps.page);
    std::vector<T> logits(rows * per * ps.P), logit(ps.P), mass(ps.P);
    std::vector<int64_t> order(ps.P), bucket(ps.bias ? ps.P : 0), kept(ps.P), counts(ps.P);
    std::vector<uint64_t> sort_keys(ps.P);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < in.B * blocks * in.Hk; ++item) {
      const int64_t g = item % in.Hk, b = item / in.Hk / blocks;
      const int64_t t0 = (item / in.Hk % blocks) * rows, t1 = std::min(t0 + rows, in.Tq);
      int64_t n_pages = 0;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rank = ps.q_rank[b * in.Tq + t];
        if (rank >= 0) n_pages = std::max(n_pages, readable_of(b, rank));
      }
      for (int64_t j = 0; j < per; ++j) {  // row r, head j: logits[(r * per + j) * P + page]
        const int64_t h = g * per + j, hf = ps.Hf == in.H ? h : g;
        page_logits(ps.qf + ((b * in.H + h) * in.Tq + t0) * ps.F, t1 - t0,
                    ps.feat + b * ps.fs[0] + hf * ps.fs[1], ps.fs[2], n_pages, ps.F,
                    ps.logit_scale, logits.data() + j * ps.P, per * ps.P);
      }
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rank = ps.q_rank[b * in.Tq + t];
        row_attention.begin(b, t);
        if (rank >= 0) {
          const int64_t own = rank / ps.page, limit = ps.causal ? rank + 1 : ps.n_real[b];
          const int64_t readable = readable_of(b, rank);
          auto forced = [&](int64_t p) {
            return p < ps.sink_pages || (p <= own && p > own - ps.local_pages);
          };
          int64_t n = 0;
          for (int64_t p = 0; p < readable; ++p)
            if (!forced(p)) order[n++] = p;
          std::fill(mass.begin(), mass.begin() + readable, T(0));
          if (ps.bias)  // a candidate's distance bucket, shared by the group's heads
            for (int64_t c = 0; c < n; ++c)
              bucket[c] = distance_bucket(std::abs(own - order[c]), ps.n_buckets);
          for (int64_t j = 0; j < per && n > 0; ++j) {
            const int64_t h = g * per + j;
            const T* row_logits = logits.data() + ((t - t0) * per + j) * ps.P;
            for (int64_t c = 0; c < n; ++c) logit[c] = row_logits[order[c]];
            if (ps.bias) {
              const T* bias_h = ps.bias + h * ps.n_buckets;
              for (int64_t c = 0; c < n; ++c) logit[c] += bias_h[bucket[c]];
            }
            T top = std::numeric_limits<T>::lowest();
            for (int64_t c = 0; c < n; ++c) top = std::max(top, logit[c]);
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < n; ++c) {
              logit[c] = exp_nonpositive(logit[c] - top);
              sum += logit[c];
            }
            const T inverse = T(1) / sum;
            for (int64_t c = 0; c < n; ++c) mass[order[c]] += logit[c] * inverse;
          }
          const int64_t keep = std::min(ps.n_top, n);
          if (keep < n) keep_best(order, mass, n, keep, sort_keys);
          // the kept pages' keys, once for the group's heads
          int64_t* pos = row_attention.positions((readable + keep) * ps.page);
          int64_t n_keys = 0, n_kept = 0;
          auto add = [&](int64_t p) {
            const int64_t lo = p * ps.page, hi = std::min(limit, lo + ps.page);
            for (int64_t r = lo; r < hi; ++r)
              pos[n_keys++] = in.position(b, r);
            kept[n_kept] = p;
            counts[n_kept++] = std::max<int64_t>(hi - lo, 0);
          };
          for (int64_t p = 0; p < readable; ++p)
            if (forced(p)) add(p);
          for (int64_t c = 0; c < keep; ++c) add(order[c]);
          if (!kt) {
            row_attention.attend(g * per, (g + 1) * per, n_keys);
          } else {
            const S* tiles = kt + (b * in.Hk + g) * ps.P * in.D * ps.page;
            row_attention.attend_pages(g * per, (g + 1) * per, tiles, ps.page, kept.data(),
                                       counts.data(), n_kept, n_keys);
          }
        }
        row_attention.finish(g * per, (g + 1) * per);
      }
    }
  }
}

}  // namespace

extern "C" {

// S: how q, k, v and the output are stored; T: what the scores, ranking and row scale are in.
#define ATTNLAB_INPUTS(S, T)                                                                   \
  const S *q, const S *k, const S *v, const int64_t *rank_to_pos, const T *row_scale, S *out, \
      const int64_t *ks, const int64_t *vs, int64_t B, int64_t H, int64_t Hk, int64_t Tq,      \
      int64_t Tk, int64_t D, int64_t Dv, double scale, const T *slopes, const T *q_pos,       \
      const T *k_pos, int symmetric
#define ATTNLAB_PACK(S, T)                                                                  \
  Inputs<S, T> {                                                                            \
    q, k, v, rank_to_pos, row_scale, out, ks, vs, B, H, Hk, Tq, Tk, D, Dv, T(scale), slopes, \
        q_pos, k_pos, symmetric                                                             \
  }

#define ATTNLAB_ENTRY_POINTS(SUFFIX, S, T)                                                    \
  void attnlab_run_attention_##SUFFIX(ATTNLAB_INPUTS(S, T), const int64_t* head,             \
                                      const int64_t* lo, const int64_t* count,               \
                                      const int64_t* width, int64_t C, int64_t W,            \
                                      int n_threads) {                                       \
    run_attention<S, T>(ATTNLAB_PACK(S, T), head, lo, count, width, C, W, n_threads);        \
  }                                                                                          \
  void attnlab_select_attention_##SUFFIX(ATTNLAB_INPUTS(S, T), const T* ranking,             \
                                         const int64_t* lengths, int64_t K,                  \
                                         int64_t k_per_head, int64_t cap, int n_threads) {   \
    select_attention<S, T>(ATTNLAB_PACK(S, T), ranking, lengths, K, k_per_head, cap,         \
                           n_threads);                                                       \
  }                                                                                          \
  ATTNLAB_PAGE_ENTRY_POINT(SUFFIX, S, T, S)

// FS: how the page features are stored
#define ATTNLAB_PAGE_ENTRY_POINT(SUFFIX, S, T, FS)                                            \
  void attnlab_page_attention_##SUFFIX(                                                      \
      ATTNLAB_INPUTS(S, T), const T* qf, const FS* feat, const int64_t* fs, int64_t Hf,      \
      int64_t P, int64_t F, const T* bias, int64_t n_buckets, const int64_t* q_rank,          \
      const int64_t* n_real, int64_t page, int64_t sink_pages, int64_t local_pages,           \
      int64_t n_top, int causal, double logit_scale, S* kt, int n_threads) {                   \
    const PageScores<FS, T> scores{qf,   feat,       fs,          Hf,    P,      F,          \
                                bias,    n_buckets,  q_rank,      n_real, page,  sink_pages, \
                                local_pages, n_top,  causal,      T(logit_scale)};            \
    page_attention<S, T, FS>(ATTNLAB_PACK(S, T), scores, kt, n_threads);                     \
  }

ATTNLAB_ENTRY_POINTS(f32, float, float)
ATTNLAB_ENTRY_POINTS(f64, double, double)
ATTNLAB_ENTRY_POINTS(bf16, bf16, float)
ATTNLAB_PAGE_ENTRY_POINT(f32_bf16, float, float, bf16)  // float32 keys, bfloat16 features

}  // extern "C"
