/* cblas_sgemm for MLX on a Linux CPU, forwarding one-row products to cblas_sgemv.

   A decode step multiplies one row per sequence by every weight matrix. OpenBLAS's
   sgemm (0.3.21, Debian 12's) first copies the whole weight panel into a packed
   buffer, also for one row, so a batch-1 step read every weight twice and wrote it
   once; sgemv reads it once. fast_blas.py compiles this file, loads it globally
   before mlx.core (libmlx resolves cblas_sgemm, cblas_dgemm and cblas_cgemm, and
   finds these), and hands it OpenBLAS's path, which it opens locally.

   Row-major C[1, N] = alpha * op(A)[1, K] . op(B)[K, N] + beta * C is the
   matrix-vector product y = alpha * op(B)^T x + beta * y: x is A's one row (stride
   lda when A is transposed), y is C's row. Other shapes go to OpenBLAS's sgemm. */
#include <dlfcn.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *,
                         int, const void *, int, const void *, void *, int);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static dgemm_fn real_dgemm;
static cgemm_fn real_cgemm;
static long forwarded;

/* Open OpenBLAS at `path` (locally: its own cblas_sgemm stays out of the global
   scope) and find what this file calls. 0 on success. */
int gemv_forward_init(const char *path) {
  void *openblas = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!openblas) return 1;
  real_sgemm = (sgemm_fn)dlsym(openblas, "cblas_sgemm");
  real_sgemv = (sgemv_fn)dlsym(openblas, "cblas_sgemv");
  real_dgemm = (dgemm_fn)dlsym(openblas, "cblas_dgemm");
  real_cgemm = (cgemm_fn)dlsym(openblas, "cblas_cgemm");
  return !(real_sgemm && real_sgemv && real_dgemm && real_cgemm);
}

/* How many products went to sgemv so far (tests read it). */
long gemv_forward_count(void) { return __atomic_load_n(&forwarded, __ATOMIC_RELAXED); }

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc) {
  if (order == ROW_MAJOR && M == 1 && N > 0 && K > 0) {
    int incx = trans_a == NO_TRANS ? 1 : lda;
    __atomic_fetch_add(&forwarded, 1, __ATOMIC_RELAXED); /* any MLX stream */
    if (trans_b == NO_TRANS) /* B [K, N]: y = B^T x */
      real_sgemv(ROW_MAJOR, TRANS, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    else /* B stored [N, K]: y = B x */
      real_sgemv(ROW_MAJOR, NO_TRANS, N, K, alpha, B, ldb, A, incx, beta, C, 1);
    return;
  }
  real_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_dgemm(int order, int trans_a, int trans_b, int M, int N, int K,
                 double alpha, const double *A, int lda, const double *B, int ldb,
                 double beta, double *C, int ldc) {
  real_dgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_cgemm(int order, int trans_a, int trans_b, int M, int N, int K,
                 const void *alpha, const void *A, int lda, const void *B, int ldb,
                 const void *beta, void *C, int ldc) {
  real_cgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
