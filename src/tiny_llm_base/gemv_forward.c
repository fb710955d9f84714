/* cblas_sgemm for MLX on a Linux CPU: products of a few rows by a kernel of its own.

   A decode step multiplies one row per sequence (a few more under speculation) by
   every weight: it should cost one read of the weights. OpenBLAS 0.3.21's sgemm
   first copies the weight into a packed buffer, and its sgemv gains nothing from a
   second core. fast_blas.py compiles this file and loads it globally before
   mlx.core (libmlx resolves cblas_sgemm, cblas_dgemm and cblas_cgemm and finds
   these), then hands it OpenBLAS's path, opened locally.

   MLX's Linear is x @ W.T: row-major A [M, K] times B stored [N, K] (trans_b). For
   M <= MAX_ROWS that layout goes to few_rows: four rows of B at a time, each read
   once from memory (the next ones prefetched) and then from L1 for every pair of
   A's rows (one row of A: B read as one prefetched stream), split over OpenBLAS's
   thread count by helper threads of this file's own (below). Other one-row layouts
   go to sgemv; products of 2^18 to 2^21 multiply-adds (a chunk's attention), which
   OpenBLAS would share with threads that then wait for a core, to small_product on
   the calling thread; everything else to OpenBLAS's sgemm. gemv_forward_enable(0)
   sends everything to sgemm, as plain OpenBLAS would (benchmarks measure a peer
   that way).

   Not OpenMP: libgomp gives each thread that opens a parallel region (each MLX
   stream's) a team of its own, and with more threads than cores it stops spinning:
   a decode step took 40 ms instead of 26 (the fast-paths appendix). One pool serves
   every stream; its helpers spin SPIN_NS for the next product before they sleep,
   and between products read ahead the weight they expect next (below). */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
enum { MAX_ROWS = 16 };       /* at 16 rows OpenBLAS's packed sgemm is as fast */
enum { SPLIT_FROM = 1 << 15 }; /* N * K below which threads cost more than they save */
enum { AHEAD = 512 };         /* one_row's prefetch distance, floats: best of 64-1024 */
enum { MAX_THREADS = 64 };
enum { SPIN_NS = 2000000 }; /* a helper awake for the next product: 0.2-5 ms alike */
/* Products of THREADED to SMALL multiply-adds (K <= SMALL_K): small_product. */
enum { THREADED = 1 << 18, SMALL = 1 << 21, SMALL_K = 4096 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *,
                         int, const void *, int, const void *, void *, int);
typedef int (*threads_fn)(void);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static dgemm_fn real_dgemm;
static cgemm_fn real_cgemm;
static threads_fn blas_threads; /* OpenBLAS's thread count: ours follows it */
static long forwarded;
static int enabled = 1;

/* Open OpenBLAS at `path` (locally: its own cblas_sgemm stays out of the global
   scope) and find what this file calls. 0 on success. */
int gemv_forward_init(const char *path) {
  void *openblas = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!openblas) return 1;
  real_sgemm = (sgemm_fn)dlsym(openblas, "cblas_sgemm");
  real_sgemv = (sgemv_fn)dlsym(openblas, "cblas_sgemv");
  real_dgemm = (dgemm_fn)dlsym(openblas, "cblas_dgemm");
  real_cgemm = (cgemm_fn)dlsym(openblas, "cblas_cgemm");
  blas_threads = (threads_fn)dlsym(openblas, "openblas_get_num_threads");
  return !(real_sgemm && real_sgemv && real_dgemm && real_cgemm);
}

/* How many products went to few_rows or sgemv so far (tests read it). */
long gemv_forward_count(void) { return __atomic_load_n(&forwarded, __ATOMIC_RELAXED); }

/* 0: every product to OpenBLAS's sgemm; 1: the default. Returns the previous. */
int gemv_forward_enable(int on) {
  return __atomic_exchange_n(&enabled, on, __ATOMIC_SEQ_CST);
}

#include "gemv_kernels.h" /* the kernels: one_row, few_rows, small_product */

/* The helpers' pool: the caller publishes a job and bumps `generation`; helper t
   (1 .. count - 1) computes block t of B's first `front` rows, the caller the rest,
   and waits for them all (`finished`). One product at a time uses it (`busy`);
   a product that finds it taken runs on its caller's thread alone.
   Between two products the caller runs the step's other operations, tens of
   microseconds a gap, and memory would sit idle. A decode step multiplies the same
   weights in the same order, so the pool remembers which weight came after which,
   and a helper done with its block prefetches its block of the next one (up to
   WARM_BYTES) until that product comes. Its block then runs partly from cache, so
   each weight keeps its own split, moved a step to whoever finished first. */
enum { WARM_BYTES = 1 << 20 }; /* half an L2 here; 0.5 to 2 MB measured alike */
enum { FOLLOWS = 1024 }; /* remembered weights: a model's projections, and more */

typedef struct { /* a weight, the helpers' rows of it, and the weight after it */
  const float *B, *next;
  int front, next_slot;
  long next_ldb;
} follow_t;

typedef struct {
  int M, N, K, lda, ldb, ldc, count, front;
  float alpha, beta;
  const float *A, *B;
  float *C;
  const float *next; /* the weight expected next (NULL: unknown) */
  long next_ldb;
  int next_slot;
} job_t;

static struct {
  pthread_mutex_t busy, lock;
  pthread_cond_t wake;
  int started;     /* helpers running; read and written under busy */
  long born[MAX_THREADS]; /* the generation out when helper t started */
  long generation; /* atomic: a new job is out */
  int finished;    /* atomic: helpers done with it */
  int sleeping;    /* atomic: helpers waiting on `wake` */
  job_t job;
  const float *last; /* under busy: the weight of the last product split */
  follow_t follows[FOLLOWS];
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Helper t's rows of a weight whose helpers share its first `front`: [*n0, *n1). */
static void helper_rows(int front, int helpers, int t, int *n0, int *n1) {
  *n0 = (int)((long)front * (t - 1) / helpers) & ~7;
  *n1 = t == helpers ? front : (int)((long)front * t / helpers) & ~7;
}

static void block(const job_t *j, int n0, int n1) { /* none when n0 >= n1 */
  few_rows(j->M, n0, n1, j->K, j->alpha, j->A, j->lda, j->B, j->ldb, j->beta, j->C,
           j->ldc);
}

static int slot_of(const float *B) { /* FOLLOWS = 2^10 slots */
  return (int)(((uintptr_t)B >> 6) * 0x9E3779B97F4A7C15ull >> 54);
}

/* Helper t's block of the next weight, its first WARM_BYTES prefetched a page at
   a time until a new product is out. */
static void warm_next(const job_t *j, int t, long seen) {
  const follow_t *next = &pool.follows[j->next_slot];
  int front = next->B == j->next ? next->front : 0, n0, n1;
  if (!j->next || !front) return;
  helper_rows(front, j->count - 1, t, &n0, &n1);
  const char *at = (const char *)(j->next + (size_t)n0 * j->next_ldb);
  long bytes = (long)(n1 - n0) * j->next_ldb * (long)sizeof(float);
  bytes = bytes < WARM_BYTES ? bytes : WARM_BYTES;
  for (long page = 0; page < bytes; page += 4096) {
    if (__atomic_load_n(&pool.generation, __ATOMIC_RELAXED) != seen) return;
    long end = page + 4096 < bytes ? page + 4096 : bytes;
    for (long b = page; b < end; b += 64) __builtin_prefetch(at + b, 0, 2);
  }
}

/* The generation after `seen`: spun for up to SPIN_NS, then slept for. */
static long next_job(long seen) {
  long g, start = now_ns();
  for (unsigned i = 1;; i++) {
    if ((g = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE)) != seen) return g;
    cpu_relax();
    if (!(i & 255) && now_ns() - start > SPIN_NS) break;
  }
  pthread_mutex_lock(&pool.lock);
  __atomic_add_fetch(&pool.sleeping, 1, __ATOMIC_SEQ_CST);
  while ((g = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST)) == seen)
    pthread_cond_wait(&pool.wake, &pool.lock);
  __atomic_sub_fetch(&pool.sleeping, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&pool.lock);
  return g;
}

static void *helper(void *arg) {
  int t = (int)(intptr_t)arg;
  long seen = pool.born[t];
  for (;;) {
    seen = next_job(seen);
    /* a copy: once counted in, the caller may publish the next job */
    job_t job = pool.job;
    int n0, n1;
    if (t < job.count) {
      helper_rows(job.front, job.count - 1, t, &n0, &n1);
      block(&job, n0, n1);
    }
    __atomic_add_fetch(&pool.finished, 1, __ATOMIC_RELEASE);
    if (t < job.count) warm_next(&job, t, seen);
  }
  return NULL;
}

/* Up to `wanted` helpers (under busy); fewer where a thread cannot start. */
static void start_helpers(int wanted) {
  while (pool.started < wanted) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pool.born[pool.started + 1] = pool.generation;
    void *t = (void *)(intptr_t)(pool.started + 1);
    int failed = pthread_create(&thread, &attr, helper, t);
    pthread_attr_destroy(&attr);
    if (failed) return;
    pool.started++;
  }
}

/* How many helper threads the pool has started (tests read it). */
int gemv_forward_helpers(void) {
  pthread_mutex_lock(&pool.busy);
  int started = pool.started;
  pthread_mutex_unlock(&pool.busy);
  return started;
}

/* few_rows split between the caller and the helpers (OpenBLAS's thread count). */
static void few_rows_split(int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
  int threads = blas_threads ? blas_threads() : 1;
  threads = threads < MAX_THREADS ? threads : MAX_THREADS;
  if (threads > 1 && (long)N * K >= SPLIT_FROM && !pthread_mutex_trylock(&pool.busy)) {
    start_helpers(threads - 1);
    int count = pool.started + 1 < threads ? pool.started + 1 : threads;
    if (count > 1) {
      int slot = slot_of(B);
      follow_t *mine = &pool.follows[slot];
      if (mine->B != B) /* a weight not seen, or another in its slot */
        *mine = (follow_t){B, NULL, (int)((long)N * (count - 1) / count) & ~7, 0, 0};
      follow_t *prev = pool.last ? &pool.follows[slot_of(pool.last)] : NULL;
      if (prev && prev->B == pool.last) /* the last weight is followed by this one */
        prev->next = B, prev->next_ldb = ldb, prev->next_slot = slot;
      pool.last = B;
      int front = mine->front < N ? mine->front : N, step = 8 * (count - 1);
      pool.job = (job_t){M, N, K, lda, ldb, ldc, count, front, alpha, beta, A, B, C,
                         mine->next, mine->next_ldb, mine->next_slot};
      __atomic_store_n(&pool.finished, 0, __ATOMIC_RELAXED);
      __atomic_add_fetch(&pool.generation, 1, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&pool.sleeping, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
      }
      block(&pool.job, front, N);
      /* helpers done first: give them more rows next time; else fewer */
      if (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) >= pool.started)
        mine->front = front + step <= N ? front + step : front;
      else
        mine->front = front - step >= step ? front - step : front;
      while (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < pool.started)
        cpu_relax();
      pthread_mutex_unlock(&pool.busy);
      return;
    }
    pthread_mutex_unlock(&pool.busy);
  }
  few_rows(M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc) {
  int mine = __atomic_load_n(&enabled, __ATOMIC_RELAXED) && order == ROW_MAJOR &&
             M >= 1 && N > 0 && K > 0;
  if (mine && M <= MAX_ROWS && trans_a == NO_TRANS && trans_b == TRANS) {
    __atomic_fetch_add(&forwarded, 1, __ATOMIC_RELAXED); /* any MLX stream */
    few_rows_split(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (mine && M == 1) {
    int incx = trans_a == NO_TRANS ? 1 : lda;
    __atomic_fetch_add(&forwarded, 1, __ATOMIC_RELAXED);
    if (trans_b == NO_TRANS) /* B [K, N]: y = B^T x */
      real_sgemv(ROW_MAJOR, TRANS, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    else /* B stored [N, K], x strided: y = B x */
      real_sgemv(ROW_MAJOR, NO_TRANS, N, K, alpha, B, ldb, A, incx, beta, C, 1);
    return;
  }
  long size = (long)M * N * K;
  if (mine && size > THREADED && size <= SMALL && K <= SMALL_K) {
    __atomic_fetch_add(&forwarded, 1, __ATOMIC_RELAXED);
    small_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
