/* gemv_forward.c's kernels, included by it after its enums: a product of a few
   rows (one_row, few_rows) and a small product on the calling thread
   (small_product). Each computes C = alpha A B + beta C on its share of C. */

typedef float v8 __attribute__((vector_size(32))); /* AVX's register, NEON's pair */

static inline v8 load8(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline float sum8(v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline void put(float *c, float v, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * v : alpha * v + beta * *c; /* beta 0: C unread */
}

/* One row: C[0, n] for n in [n0, n1), B's rows one after another, one stream
   through memory prefetched AHEAD floats ahead (eight streams were slower). Four
   sums in flight hide the multiply-add's latency. Returns n1. */
static int one_row(int n0, int n1, int K, float alpha, const float *A, const float *B,
                   int ldb, float beta, float *C) {
  int K32 = K & ~31;
  for (int n = n0; n < n1; n++) {
    const float *b = B + (size_t)n * ldb;
    v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    int k = 0;
    for (; k < K32; k += 32) {
      __builtin_prefetch(b + k + AHEAD), __builtin_prefetch(b + k + AHEAD + 16);
      c0 += load8(A + k) * load8(b + k), c1 += load8(A + k + 8) * load8(b + k + 8);
      c2 += load8(A + k + 16) * load8(b + k + 16);
      c3 += load8(A + k + 24) * load8(b + k + 24);
    }
    float s = sum8((c0 + c1) + (c2 + c3));
    for (; k < K; k++) s += A[k] * b[k];
    put(C + n, s, alpha, beta);
  }
  return n1;
}

/* C[m, n] for every m < M and n in [n0, n1). */
static void few_rows(int M, int n0, int n1, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
  int K8 = K & ~7, n = M == 1 ? one_row(n0, n1, K, alpha, A, B, ldb, beta, C) : n0;
  for (; n + 4 <= n1; n += 4) {
    const float *b[4];
    for (int j = 0; j < 4; j++) b[j] = B + (size_t)(n + j) * ldb;
    const float *next = b[0] + 4 * (size_t)ldb;
    int m = 0;
    for (; m + 2 <= M; m += 2) {
      const float *a0 = A + (size_t)m * lda, *a1 = a0 + lda;
      v8 c00 = {0}, c01 = {0}, c02 = {0}, c03 = {0};
      v8 c10 = {0}, c11 = {0}, c12 = {0}, c13 = {0};
      for (int k = 0; k < K8; k += 8) {
        if (m == 0)
          for (int j = 0; j < 4; j++) __builtin_prefetch(next + j * (size_t)ldb + k);
        v8 x0 = load8(a0 + k), x1 = load8(a1 + k), w;
        w = load8(b[0] + k), c00 += x0 * w, c10 += x1 * w;
        w = load8(b[1] + k), c01 += x0 * w, c11 += x1 * w;
        w = load8(b[2] + k), c02 += x0 * w, c12 += x1 * w;
        w = load8(b[3] + k), c03 += x0 * w, c13 += x1 * w;
      }
      float s[2][4] = {{sum8(c00), sum8(c01), sum8(c02), sum8(c03)},
                       {sum8(c10), sum8(c11), sum8(c12), sum8(c13)}};
      for (int j = 0; j < 4; j++) {
        for (int k = K8; k < K; k++)
          s[0][j] += a0[k] * b[j][k], s[1][j] += a1[k] * b[j][k];
        put(C + (size_t)m * ldc + n + j, s[0][j], alpha, beta);
        put(C + (size_t)(m + 1) * ldc + n + j, s[1][j], alpha, beta);
      }
    }
    if (m < M) { /* an odd row */
      const float *a0 = A + (size_t)m * lda;
      v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
      for (int k = 0; k < K8; k += 8) {
        if (m == 0)
          for (int j = 0; j < 4; j++) __builtin_prefetch(next + j * (size_t)ldb + k);
        v8 x0 = load8(a0 + k);
        c0 += x0 * load8(b[0] + k), c1 += x0 * load8(b[1] + k);
        c2 += x0 * load8(b[2] + k), c3 += x0 * load8(b[3] + k);
      }
      float s[4] = {sum8(c0), sum8(c1), sum8(c2), sum8(c3)};
      for (int j = 0; j < 4; j++) {
        for (int k = K8; k < K; k++) s[j] += a0[k] * b[j][k];
        put(C + (size_t)m * ldc + n + j, s[j], alpha, beta);
      }
    }
  }
  for (; n < n1; n++) { /* the last N % 4 rows of B */
    const float *b0 = B + (size_t)n * ldb;
    for (int m = 0; m < M; m++) {
      const float *a0 = A + (size_t)m * lda;
      v8 c = {0};
      for (int k = 0; k < K8; k += 8) c += load8(a0 + k) * load8(b0 + k);
      float s = sum8(c);
      for (int k = K8; k < K; k++) s += a0[k] * b0[k];
      put(C + (size_t)m * ldc + n, s, alpha, beta);
    }
  }
}

/* C = alpha A B + beta C on the calling thread, any layout, for a product too small
   to share (a chunk's attention): OpenBLAS wakes its own threads from 2^18
   multiply-adds, and beside this file's spinning helpers they wait for a core (a
   5-token chunk took 66 ms a forward instead of 37). K <= SMALL_K. */
static void small_product(int ta, int tb, int M, int N, int K, float alpha,
                          const float *A, int lda, const float *B, int ldb, float beta,
                          float *C, int ldc) {
  if (ta == NO_TRANS && tb == TRANS) {
    few_rows(M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  float row[SMALL_K]; /* A's row m, contiguous */
  for (int m = 0; m < M; m++) {
    for (int k = 0; k < K; k++)
      row[k] = ta == NO_TRANS ? A[(size_t)m * lda + k] : A[(size_t)k * lda + m];
    float *c = C + (size_t)m * ldc;
    if (tb == TRANS) { /* B [N, K]: a dot product for each n */
      few_rows(1, 0, N, K, alpha, row, K, B, ldb, beta, c, ldc);
      continue;
    }
    int n = 0; /* B [K, N]: its rows, scaled, added into 32 or 8 columns at a time */
    for (; n + 32 <= N; n += 32) { /* four sums in flight */
      v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
      for (int k = 0; k < K; k++) {
        const float *b = B + (size_t)k * ldb + n;
        c0 += row[k] * load8(b), c1 += row[k] * load8(b + 8);
        c2 += row[k] * load8(b + 16), c3 += row[k] * load8(b + 24);
      }
      for (int j = 0; j < 8; j++) {
        put(c + n + j, c0[j], alpha, beta), put(c + n + 8 + j, c1[j], alpha, beta);
        put(c + n + 16 + j, c2[j], alpha, beta);
        put(c + n + 24 + j, c3[j], alpha, beta);
      }
    }
    for (; n + 8 <= N; n += 8) {
      v8 acc = {0};
      for (int k = 0; k < K; k++) acc += row[k] * load8(B + (size_t)k * ldb + n);
      for (int j = 0; j < 8; j++) put(c + n + j, acc[j], alpha, beta);
    }
    for (; n < N; n++) {
      float s = 0;
      for (int k = 0; k < K; k++) s += row[k] * B[(size_t)k * ldb + n];
      put(c + n, s, alpha, beta);
    }
  }
}
