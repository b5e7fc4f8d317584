/*
 * The C interface's test program, run as every rank of a job by tests/c_programs.rs:
 *
 *   check all     every collective (blocking and started) over several types and reductions
 *                 against a plain reference, batches, sub-communicators, argument errors,
 *                 and last a count that disagrees (JACCL_MISMATCH)
 *   check config  as `all`'s first part, started from a jaccl_config_t (JACCL_TEST_RANK,
 *                 _SIZE, _COORDINATOR, _TOKEN) instead of the environment
 *   check kill    rank 1 dies (SIGKILL) after a barrier; the others get JACCL_PEER_LOST
 *                 naming it, shrink, and go on without it
 *                 (with JACCL_TEST_INVITATION, a file: then grow by one newcomer, which runs
 *                 `check join`, joining with jaccl_config_t.join)
 *   check abort   rank 0 aborts while idle; the others' next call gets JACCL_PEER_LOST
 *
 * Prints "rank R: ok" and exits 0, or says what failed and exits 1.
 */
#include <jaccl.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank = -1, size = 0;

#define FAIL(...)                                     \
  do {                                                \
    fprintf(stderr, "rank %d: line %d: ", rank, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                     \
    fprintf(stderr, "\n");                            \
    exit(1);                                          \
  } while (0)

/* A call that must succeed. */
#define OK(call)                                                                    \
  do {                                                                              \
    jaccl_result_t r_ = (call);                                                     \
    if (r_ != JACCL_SUCCESS)                                                        \
      FAIL("%s: %s: %s", #call, jaccl_get_error_string(r_), jaccl_get_last_error()); \
  } while (0)

/* A call that must fail with `code`, its message naming `word`. */
#define FAILS(code, word, call)                                                            \
  do {                                                                                     \
    jaccl_result_t r_ = (call);                                                            \
    if (r_ != (code))                                                                      \
      FAIL("%s: got %s, not %s: %s", #call, jaccl_get_error_string(r_),                     \
           jaccl_get_error_string(code), jaccl_get_last_error());                          \
    if (!strstr(jaccl_get_last_error(), (word)))                                           \
      FAIL("%s: the message does not say \"%s\": %s", #call, (word), jaccl_get_last_error()); \
  } while (0)

/* Runs jaccl_NAME(args), or, with `use_start`, jaccl_NAME_start(args) and waits for it. */
static int use_start = 0;
#define DO(name, ...)                                         \
  do {                                                        \
    if (use_start) {                                          \
      jaccl_request_t *q_ = NULL;                             \
      OK(jaccl_##name##_start(__VA_ARGS__, &q_));             \
      OK(jaccl_request_wait(q_));                             \
      OK(jaccl_request_free(q_));                             \
    } else {                                                  \
      OK(jaccl_##name(__VA_ARGS__));                          \
    }                                                         \
  } while (0)

/* Rank r's value i: small integers, exact in every type, sums and products too. */
static double value(int r, size_t i) { return (double)((r * 7 + (int)i * 3) % 5 + 1); }

/* The reference reduction of value(r, i) over ranks [0, n). */
static double reduced(jaccl_op_t op, size_t i, int n) {
  double acc = value(0, i);
  for (int r = 1; r < n; r++) {
    double v = value(r, i);
    switch (op) {
      case JACCL_SUM: acc += v; break;
      case JACCL_PROD: acc *= v; break;
      case JACCL_MAX: acc = v > acc ? v : acc; break;
      case JACCL_MIN: acc = v < acc ? v : acc; break;
      default: FAIL("no reference for op %d", op);
    }
  }
  return acc;
}

/* Element i of a buffer of dtype, as a double, and the other way. */
static double get(const void *buf, jaccl_dtype_t d, size_t i) {
  switch (d) {
    case JACCL_INT32: return ((const int32_t *)buf)[i];
    case JACCL_INT64: return (double)((const int64_t *)buf)[i];
    case JACCL_UINT8: return ((const uint8_t *)buf)[i];
    case JACCL_FLOAT32: return ((const float *)buf)[i];
    case JACCL_FLOAT64: return ((const double *)buf)[i];
    default: FAIL("no accessor for dtype %d", d);
  }
  return 0;
}

static void set(void *buf, jaccl_dtype_t d, size_t i, double v) {
  switch (d) {
    case JACCL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case JACCL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case JACCL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case JACCL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case JACCL_FLOAT64: ((double *)buf)[i] = v; break;
    default: FAIL("no accessor for dtype %d", d);
  }
}

static const jaccl_dtype_t DTYPES[] = {JACCL_INT32, JACCL_INT64, JACCL_UINT8, JACCL_FLOAT32,
                                       JACCL_FLOAT64};
static const size_t ESIZE[] = {4, 8, 1, 4, 8};
static const jaccl_op_t OPS[] = {JACCL_SUM, JACCL_MAX, JACCL_MIN, JACCL_PROD};

/* value(rank, i) for i in [0, n), of dtype d, in a new buffer. */
static void *filled(jaccl_dtype_t d, size_t esize, size_t n, int r, size_t offset) {
  void *buf = calloc(n ? n : 1, esize);
  for (size_t i = 0; i < n; i++) set(buf, d, i, value(r, offset + i));
  return buf;
}

static void expect(const void *buf, jaccl_dtype_t d, size_t i, double want, const char *what) {
  double got = get(buf, d, i);
  if (got != want) FAIL("%s: dtype %d element %zu is %g, not %g", what, d, i, got, want);
}

static void reductions(jaccl_comm_t *comm) {
  const size_t counts[] = {0, 1, 7, 1000, 70001};
  for (size_t t = 0; t < sizeof DTYPES / sizeof *DTYPES; t++) {
    jaccl_dtype_t d = DTYPES[t];
    for (size_t o = 0; o < sizeof OPS / sizeof *OPS; o++) {
      jaccl_op_t op = OPS[o];
      /* uint8 products overflow past a few ranks: the reference is not modular. */
      if (d == JACCL_UINT8 && op == JACCL_PROD && size > 2) continue;
      for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        size_t n = counts[c];
        void *in = filled(d, ESIZE[t], n, rank, 0), *out = calloc(n ? n : 1, ESIZE[t]);
        OK(jaccl_all_reduce(in, out, n, d, op, comm));
        for (size_t i = 0; i < n; i++) expect(out, d, i, reduced(op, i, size), "all_reduce");
        /* In place. */
        OK(jaccl_all_reduce(in, in, n, d, op, comm));
        for (size_t i = 0; i < n; i++) expect(in, d, i, reduced(op, i, size), "all_reduce in place");
        free(in);
        free(out);
      }
      /* Reduce-scatter and reduce, one size. */
      size_t block = 333, whole = block * (size_t)size;
      void *in = filled(d, ESIZE[t], whole, rank, 0), *out = calloc(whole, ESIZE[t]);
      DO(reduce_scatter, in, out, block, d, op, comm);
      for (size_t i = 0; i < block; i++)
        expect(out, d, i, reduced(op, (size_t)rank * block + i, size), "reduce_scatter");
      int root = size - 1;
      DO(reduce, in, rank == root ? out : NULL, whole, d, op, root, comm);
      if (rank == root)
        for (size_t i = 0; i < whole; i++) expect(out, d, i, reduced(op, i, size), "reduce");
      free(in);
      free(out);
    }
  }
}

static void movements(jaccl_comm_t *comm) {
  const jaccl_dtype_t d = JACCL_INT32;
  const size_t n = 513, whole = n * (size_t)size;
  int32_t *in = filled(d, 4, n, rank, 0), *out = calloc(whole, 4);
  /* All-gather: block r is value(r, i). */
  DO(all_gather, in, out, n, d, comm);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++) expect(out, d, (size_t)r * n + i, value(r, i), "all_gather");
  /* Gather to rank 1 % size; scatter from it. */
  int root = 1 % size;
  memset(out, 0, whole * 4);
  DO(gather, in, rank == root ? out : NULL, n, d, root, comm);
  if (rank == root)
    for (int r = 0; r < size; r++)
      for (size_t i = 0; i < n; i++) expect(out, d, (size_t)r * n + i, value(r, i), "gather");
  int32_t *blocks = filled(d, 4, whole, root, 0), *mine = calloc(n, 4);
  DO(scatter, rank == root ? blocks : NULL, mine, n, d, root, comm);
  for (size_t i = 0; i < n; i++) expect(mine, d, i, value(root, (size_t)rank * n + i), "scatter");
  /* Broadcast from the last rank, from a separate buffer and in place. */
  int32_t *data = filled(d, 4, n, rank, 0);
  DO(broadcast, in, data, n, d, size - 1, comm);
  for (size_t i = 0; i < n; i++) expect(data, d, i, value(size - 1, i), "broadcast");
  int32_t *again = filled(d, 4, n, rank, 0);
  DO(broadcast, again, again, n, d, 0, comm);
  for (size_t i = 0; i < n; i++) expect(again, d, i, value(0, i), "broadcast in place");
  /* All-to-all: this rank's block r is value(rank, r * n + i); it gets block `rank` of each. */
  int32_t *sends = filled(d, 4, whole, rank, 0);
  DO(all_to_all, sends, out, n, d, comm);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++)
      expect(out, d, (size_t)r * n + i, value(r, (size_t)rank * n + i), "all_to_all");
  /* Uneven: rank r sends r + j + 1 elements to rank j. */
  size_t *sendcounts = calloc((size_t)size, sizeof(size_t)), *recvcounts = calloc((size_t)size, sizeof(size_t));
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < size; j++) {
    sendcounts[j] = (size_t)(rank + j + 1);
    recvcounts[j] = (size_t)(j + rank + 1);
    stotal += sendcounts[j];
    rtotal += recvcounts[j];
  }
  int32_t *vin = filled(d, 4, stotal, rank, 0), *vout = calloc(rtotal, 4);
  DO(all_to_all_v, vin, sendcounts, vout, recvcounts, d, comm);
  size_t at = 0;
  for (int j = 0; j < size; j++) {
    size_t from = 0; /* where rank j's block for this rank starts in its sendbuf */
    for (int k = 0; k < rank; k++) from += (size_t)(j + k + 1);
    for (size_t i = 0; i < recvcounts[j]; i++) expect(vout, d, at + i, value(j, from + i), "all_to_all_v");
    at += recvcounts[j];
  }
  /* All-gather-v and reduce-scatter-v with counts r + 2. */
  size_t *counts = calloc((size_t)size, sizeof(size_t)), total = 0;
  for (int r = 0; r < size; r++) total += counts[r] = (size_t)(r + 2);
  int32_t *gv = calloc(total, 4);
  DO(all_gather_v, in, gv, counts, d, comm);
  at = 0;
  for (int r = 0; r < size; r++) {
    for (size_t i = 0; i < counts[r]; i++) expect(gv, d, at + i, value(r, i), "all_gather_v");
    at += counts[r];
  }
  int32_t *rin = filled(d, 4, total, rank, 0), *rout = calloc(counts[rank], 4);
  DO(reduce_scatter_v, rin, rout, counts, d, JACCL_SUM, comm);
  size_t start = 0;
  for (int r = 0; r < rank; r++) start += counts[r];
  for (size_t i = 0; i < counts[rank]; i++)
    expect(rout, d, i, reduced(JACCL_SUM, start + i, size), "reduce_scatter_v");
  /* Reduce-scatter and reduce of all_to_all's inputs (whole = size blocks). */
  DO(reduce_scatter, sends, mine, n, d, JACCL_SUM, comm);
  for (size_t i = 0; i < n; i++)
    expect(mine, d, i, reduced(JACCL_SUM, (size_t)rank * n + i, size), "reduce_scatter");
  DO(reduce, sends, rank == 0 ? out : NULL, whole, d, JACCL_MAX, 0, comm);
  if (rank == 0)
    for (size_t i = 0; i < whole; i++) expect(out, d, i, reduced(JACCL_MAX, i, size), "reduce");
  DO(barrier, comm);
  free(in); free(out); free(blocks); free(mine); free(data); free(again); free(sends);
  free(sendcounts); free(recvcounts); free(vin); free(vout); free(counts); free(gv); free(rin); free(rout);
}

/* Every rank receives from its left before it sends to its right: a deadlock one call at a
 * time, fine in a batch. Then a receive from any rank. */
static void point_to_point(jaccl_comm_t *comm) {
  if (size < 2) return;
  const size_t n = 100000;
  int left = (rank + size - 1) % size, right = (rank + 1) % size;
  double *mine = filled(JACCL_FLOAT64, 8, n, rank, 0), *got = calloc(n, 8);
  OK(jaccl_batch_begin());
  OK(jaccl_recv(got, n, JACCL_FLOAT64, left, 7, comm));
  OK(jaccl_send(mine, n, JACCL_FLOAT64, right, 7, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "batch", jaccl_barrier(comm));
  FAILS(JACCL_INVALID_ARGUMENT, "itself", jaccl_send(mine, n, JACCL_FLOAT64, rank, 7, comm));
  OK(jaccl_batch_end());
  for (size_t i = 0; i < n; i++) expect(got, JACCL_FLOAT64, i, value(left, i), "batched recv");
  FAILS(JACCL_INVALID_ARGUMENT, "no batch", jaccl_batch_end());
  /* Every rank but 0 sends rank 0 its rank; rank 0 takes them as they come. */
  if (rank == 0) {
    int seen = 0;
    for (int k = 1; k < size; k++) {
      int32_t v = -1;
      int source = -1;
      OK(jaccl_recv_any(&v, 1, JACCL_INT32, 9, &source, comm));
      if (v != source || source < 1 || source >= size || (seen & (1 << source)))
        FAIL("recv_any: %d from %d", (int)v, source);
      seen |= 1 << source;
    }
  } else {
    int32_t v = rank;
    OK(jaccl_send(&v, 1, JACCL_INT32, 0, 9, comm));
  }
  free(mine);
  free(got);
}

static void started(jaccl_comm_t *comm) {
  const size_t n = 1 << 18;
  float *a = filled(JACCL_FLOAT32, 4, n, rank, 0), *b = calloc(n * (size_t)size, 4);
  jaccl_request_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
  OK(jaccl_all_reduce_start(a, a, n, JACCL_FLOAT32, JACCL_SUM, comm, &r1));
  OK(jaccl_all_gather_start(a + n / 2, b, n / 2, JACCL_FLOAT32, comm, &r2));
  OK(jaccl_barrier_start(comm, &r3));
  int done = 0;
  OK(jaccl_request_test(r1, &done));
  OK(jaccl_request_wait_timeout(r2, 60.0, &done));
  if (!done) FAIL("an all_gather started has not ended in 60 s");
  OK(jaccl_request_wait(r1));
  OK(jaccl_request_test(r1, &done));
  if (!done) FAIL("a request waited for is not done");
  for (size_t i = 0; i < n; i++) expect(a, JACCL_FLOAT32, i, reduced(JACCL_SUM, i, size), "all_reduce_start");
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n / 2; i++)
      expect(b, JACCL_FLOAT32, (size_t)r * (n / 2) + i, reduced(JACCL_SUM, n / 2 + i, size), "all_gather_start");
  OK(jaccl_request_wait(r3));
  int source = -1;
  FAILS(JACCL_INVALID_ARGUMENT, "not a recv_any", jaccl_request_source(r3, &source));
  OK(jaccl_request_free(r1));
  OK(jaccl_request_free(r2));
  OK(jaccl_request_free(r3));
  OK(jaccl_request_free(NULL));
  /* A receive from any rank, started: rank size-1 sends rank 0 one value. */
  if (size > 1 && rank == 0) {
    int64_t v = 0;
    jaccl_request_t *r = NULL;
    OK(jaccl_recv_any_start(&v, 1, JACCL_INT64, 3, comm, &r));
    OK(jaccl_request_wait(r));
    OK(jaccl_request_source(r, &source));
    if (source != size - 1 || v != 42) FAIL("recv_any_start: %lld from %d", (long long)v, source);
    OK(jaccl_request_free(r));
  } else if (size > 1 && rank == size - 1) {
    int64_t v = 42;
    jaccl_request_t *r = NULL;
    OK(jaccl_send_start(&v, 1, JACCL_INT64, 0, 3, comm, &r));
    OK(jaccl_request_wait(r));
    OK(jaccl_request_free(r));
  }
  free(a);
  free(b);
}

static void subgroups(jaccl_comm_t *comm) {
  jaccl_comm_t *half = NULL, *ends = NULL, *none = NULL;
  OK(jaccl_comm_split(comm, rank % 2, -rank, &half));
  int hrank = -1, hsize = 0;
  OK(jaccl_comm_rank(half, &hrank));
  OK(jaccl_comm_size(half, &hsize));
  if (hsize != (size + 1 - rank % 2) / 2) FAIL("split: size %d", hsize);
  if (hrank != hsize - 1 - rank / 2) FAIL("split: key -rank gives rank %d", hrank);
  int32_t v = rank, sum = 0, want = 0;
  for (int r = rank % 2; r < size; r += 2) want += r;
  OK(jaccl_all_reduce(&v, &sum, 1, JACCL_INT32, JACCL_SUM, half));
  if (sum != want) FAIL("all_reduce in a split: %d, not %d", (int)sum, (int)want);
  OK(jaccl_comm_destroy(half));
  int members[2] = {size - 1, 0};
  OK(jaccl_comm_subgroup(comm, members, size > 1 ? 2 : 1, &ends));
  if ((ends != NULL) != (rank == 0 || rank == size - 1)) FAIL("subgroup: membership");
  if (ends) {
    OK(jaccl_all_reduce(&v, &sum, 1, JACCL_INT32, JACCL_SUM, ends));
    if (sum != (size > 1 ? size - 1 : 0)) FAIL("all_reduce in a subgroup: %d", (int)sum);
    OK(jaccl_comm_destroy(ends));
  }
  OK(jaccl_comm_split(comm, JACCL_SPLIT_NOCOLOR, 0, &none));
  if (none) FAIL("split with no color gave a communicator");
  /* A batch over two communicators: each rank sends a large message to its right, on the
   * twin if it is odd, and receives from its left: with an even size, every rank sends on
   * one and receives on the other, where neither send can finish first. */
  if (size > 1) {
    jaccl_comm_t *twin = NULL;
    OK(jaccl_comm_split(comm, 0, rank, &twin));
    const size_t n = 1 << 20;
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    float *mine = filled(JACCL_FLOAT32, 4, n, rank, 0), *got = calloc(n, 4);
    FAILS(JACCL_INVALID_ARGUMENT, "batch", (jaccl_batch_begin(), jaccl_comm_split(comm, 0, 0, &none)));
    OK(jaccl_send(mine, n, JACCL_FLOAT32, right, 1, rank % 2 ? twin : comm));
    OK(jaccl_recv(got, n, JACCL_FLOAT32, left, 1, left % 2 ? twin : comm));
    OK(jaccl_batch_end());
    for (size_t i = 0; i < n; i++) expect(got, JACCL_FLOAT32, i, value(left, i), "batch over two communicators");
    OK(jaccl_comm_destroy(twin));
    free(mine);
    free(got);
  }
}

/* Another thread's receive on `comm` that waits for what the batch's part on `twin` lets the
 * peer send: the batch must start that part without waiting for `comm`. Ranks 0 and 1. */
struct waiting_recv {
  jaccl_comm_t *comm;
  int32_t got;
  jaccl_result_t result;
};

static void *receive_tag_7(void *arg) {
  struct waiting_recv *w = arg;
  w->result = jaccl_recv(&w->got, 1, JACCL_INT32, 1, 7, w->comm);
  return NULL;
}

static void batch_beside_a_thread(jaccl_comm_t *comm) {
  if (size < 2) return;
  jaccl_comm_t *twin = NULL;
  int pair[2] = {0, 1};
  OK(jaccl_comm_subgroup(comm, pair, 2, &twin)); /* collective: NULL on the others */
  if (rank > 1) return;
  const size_t n = 1 << 21;
  float *big = filled(JACCL_FLOAT32, 4, n, rank, 0);
  int32_t small = 5, back = 0;
  if (rank == 0) {
    struct waiting_recv w = {comm, 0, -1};
    pthread_t thread;
    if (pthread_create(&thread, NULL, receive_tag_7, &w) != 0) FAIL("pthread_create");
    nanosleep(&(struct timespec){0, 100000000}, NULL); /* the thread holds `comm` first */
    OK(jaccl_batch_begin());
    OK(jaccl_send(&small, 1, JACCL_INT32, 1, 3, comm));
    OK(jaccl_recv(big, n, JACCL_FLOAT32, 1, 4, twin));
    OK(jaccl_batch_end());
    pthread_join(thread, NULL);
    if (w.result != JACCL_SUCCESS || w.got != 7) FAIL("the thread's recv: %s, %d", jaccl_get_error_string(w.result), (int)w.got);
    for (size_t i = 0; i < n; i++) expect(big, JACCL_FLOAT32, i, value(1, i), "batch beside a thread");
  } else {
    OK(jaccl_send(big, n, JACCL_FLOAT32, 0, 4, twin));
    int32_t seven = 7;
    OK(jaccl_send(&seven, 1, JACCL_INT32, 0, 7, comm));
    OK(jaccl_recv(&back, 1, JACCL_INT32, 0, 3, comm));
    if (back != 5) FAIL("tag 3: %d", (int)back);
  }
  OK(jaccl_comm_destroy(twin));
  free(big);
}

static void misuse(jaccl_comm_t *comm) {
  float x[4] = {0}, y[4] = {0};
  static char bytes[4096]; /* zeros: neither a communicator nor a configuration */
  jaccl_comm_t *out = NULL;
  jaccl_request_t *req = NULL;
  FAILS(JACCL_INVALID_ARGUMENT, "sendbuf is NULL", jaccl_all_reduce(NULL, y, 4, JACCL_FLOAT32, JACCL_SUM, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "all_reduce", jaccl_all_reduce(x, NULL, 4, JACCL_FLOAT32, JACCL_SUM, comm));
  char rank_text[32];
  snprintf(rank_text, sizeof rank_text, "rank %d", rank);
  FAILS(JACCL_INVALID_ARGUMENT, rank_text, jaccl_all_reduce(NULL, y, 4, JACCL_FLOAT32, JACCL_SUM, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "not aligned", jaccl_all_reduce(bytes + 1, y, 4, JACCL_FLOAT32, JACCL_SUM, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "dtype 99", jaccl_all_reduce(x, y, 4, 99, JACCL_SUM, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "op -1", jaccl_all_reduce(x, y, 4, JACCL_FLOAT32, -1, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "band", jaccl_all_reduce(x, y, 4, JACCL_FLOAT32, JACCL_BAND, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "overflow", jaccl_all_reduce(x, y, SIZE_MAX / 2, JACCL_FLOAT32, JACCL_SUM, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "rank 99", jaccl_broadcast(x, y, 4, JACCL_FLOAT32, 99, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "rank -1", jaccl_send(x, 4, JACCL_FLOAT32, -1, 0, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "counts is NULL", jaccl_all_gather_v(x, y, NULL, JACCL_FLOAT32, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "comm is NULL", jaccl_barrier(NULL));
  FAILS(JACCL_INVALID_ARGUMENT, "not a communicator", jaccl_barrier((jaccl_comm_t *)(void *)bytes));
  FAILS(JACCL_INVALID_ARGUMENT, "request is NULL", jaccl_all_reduce_start(x, y, 4, JACCL_FLOAT32, JACCL_SUM, comm, NULL));
  FAILS(JACCL_INVALID_ARGUMENT, "request is NULL", jaccl_request_wait(NULL));
  FAILS(JACCL_INVALID_ARGUMENT, "color -5", jaccl_comm_split(comm, -5, 0, &out));
  FAILS(JACCL_INVALID_ARGUMENT, "output communicator is NULL", jaccl_comm_split(comm, 0, 0, NULL));
  FAILS(JACCL_INVALID_ARGUMENT, "timeout", jaccl_comm_set_timeout(comm, -1.0));
  FAILS(JACCL_INVALID_ARGUMENT, "does not apply", jaccl_all_reduce_start(x, y, 4, JACCL_FLOAT32, JACCL_BXOR, comm, &req));
  if (req != NULL) FAIL("a start refused left a request");
  FAILS(JACCL_INVALID_ARGUMENT, "itself", jaccl_send(x, 4, JACCL_FLOAT32, rank, 0, comm));
  FAILS(JACCL_INVALID_ARGUMENT, "aligned", jaccl_comm_rank(comm, (int *)(void *)(bytes + 1)));
  FAILS(JACCL_INVALID_ARGUMENT, "not a timeout", jaccl_comm_set_timeout(comm, 1e-12));
  FAILS(JACCL_INVALID_ARGUMENT, "config", jaccl_comm_init(NULL, &out));
  {
    jaccl_config_t config;
    OK(jaccl_config_init(&config));
    config.struct_size -= 8; /* not a size any header had */
    FAILS(JACCL_INVALID_ARGUMENT, "struct_size", jaccl_comm_init(&config, &out));
    OK(jaccl_config_init(&config));
    config.rank = 0;
    config.size = 1;
    config.timeout = NAN;
    FAILS(JACCL_CONFIG_ERROR, "jaccl_config_t.timeout", jaccl_comm_init(&config, &out));
    config.timeout = 0;
    config.transport = "carrier-pigeon";
    FAILS(JACCL_CONFIG_ERROR, "init", jaccl_comm_init(&config, &out));
  }
  FAILS(JACCL_INVALID_ARGUMENT, "jaccl_config_init", jaccl_comm_init((const jaccl_config_t *)(const void *)bytes, &out));
  if (out != NULL) FAIL("a failed init left a communicator");
  FAILS(JACCL_INVALID_ARGUMENT, "sendbuf", jaccl_all_reduce_start(NULL, y, 4, JACCL_FLOAT32, JACCL_SUM, comm, &req));
  if (req != NULL) FAIL("a failed start left a request");
  /* The message of the communicator's last error is the thread's. */
  if (strcmp(jaccl_comm_get_last_error(comm), jaccl_get_last_error()) != 0)
    FAIL("last errors differ: %s / %s", jaccl_comm_get_last_error(comm), jaccl_get_last_error());
  for (jaccl_result_t code = 0; code <= JACCL_INTERNAL_ERROR; code++)
    if (strcmp(jaccl_get_error_string(code), "unknown result code") == 0) FAIL("code %d has no name", code);
  if (strcmp(jaccl_get_error_string(1000), "unknown result code") != 0) FAIL("code 1000 has a name");
  /* Argument errors leave the communicator usable. */
  OK(jaccl_all_reduce(x, y, 4, JACCL_FLOAT32, JACCL_SUM, comm));
  OK(jaccl_comm_set_timeout(comm, 600.0));
}

/* Rank 0 passes one element more than the others: nobody gets data, everybody an error. */
static void disagreement(jaccl_comm_t *comm) {
  if (size < 2) return;
  float x[8] = {0}, y[8] = {0};
  jaccl_result_t r = jaccl_all_reduce(x, y, rank == 0 ? 5 : 4, JACCL_FLOAT32, JACCL_SUM, comm);
  if (r != JACCL_MISMATCH && r != JACCL_PEER_LOST)
    FAIL("counts that disagree: %s: %s", jaccl_get_error_string(r), jaccl_get_last_error());
  if (r == JACCL_MISMATCH && !strstr(jaccl_get_last_error(), "disagrees"))
    FAIL("the mismatch does not say what: %s", jaccl_get_last_error());
  /* The communicator is poisoned: the next call fails with the same error. */
  jaccl_result_t again = jaccl_barrier(comm);
  if (again != r) FAIL("after a mismatch, barrier: %s", jaccl_get_error_string(again));
}

static void killed(jaccl_comm_t *comm) {
  if (size < 3) FAIL("kill needs 3 ranks");
  /* Rank 1 may leave the barrier, and die, before the others have: theirs may fail. */
  jaccl_result_t r = jaccl_barrier(comm);
  if (rank == 1) {
    if (r != JACCL_SUCCESS) FAIL("barrier: %s", jaccl_get_last_error());
    raise(SIGKILL);
  }
  float x[1024] = {0}, y[1024];
  /* Until the loss is seen (a sum can complete among survivors before rank 1's end shows). */
  for (int i = 0; r == JACCL_SUCCESS; i++) {
    if (i > 1000) FAIL("rank 1 was killed and the all_reduce still succeeds");
    r = jaccl_all_reduce(x, y, 1024, JACCL_FLOAT32, JACCL_SUM, comm);
  }
  if (r != JACCL_PEER_LOST) FAIL("after a kill: %s: %s", jaccl_get_error_string(r), jaccl_get_last_error());
  if (!strstr(jaccl_comm_get_last_error(comm), "rank 1"))
    FAIL("PEER_LOST does not name rank 1: %s", jaccl_comm_get_last_error(comm));
  /* A started operation on the poisoned communicator ends with the error: done is 1. */
  jaccl_request_t *late = NULL;
  OK(jaccl_all_reduce_start(x, y, 1024, JACCL_FLOAT32, JACCL_SUM, comm, &late));
  int done = 0;
  for (int i = 0; !done; i++) {
    if (i > 60000) FAIL("a started operation on a failed communicator has not ended in a minute");
    r = jaccl_request_test(late, &done);
    if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  if (r != JACCL_PEER_LOST) FAIL("request_test after a kill: %s", jaccl_get_error_string(r));
  OK(jaccl_request_free(late));
  jaccl_comm_t *alive = NULL;
  OK(jaccl_comm_shrink(comm, &alive));
  int n = 0;
  OK(jaccl_comm_size(alive, &n));
  if (n != size - 1) FAIL("shrink: %d ranks", n);
  int32_t v = 1, sum = 0;
  OK(jaccl_all_reduce(&v, &sum, 1, JACCL_INT32, JACCL_SUM, alive));
  if (sum != size - 1) FAIL("all_reduce after shrink: %d", (int)sum);
  /* A newcomer takes rank 1's place: the test starts it once the invitation is written. */
  const char *path = getenv("JACCL_TEST_INVITATION");
  if (path) {
    int arank = -1;
    OK(jaccl_comm_rank(alive, &arank));
    if (arank == 0) {
      char invitation[256], tmp[4096];
      OK(jaccl_comm_invitation(alive, invitation, sizeof invitation));
      snprintf(tmp, sizeof tmp, "%s.tmp", path);
      FILE *f = fopen(tmp, "w");
      if (!f || fputs(invitation, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
        FAIL("cannot write the invitation to %s", path);
    }
    jaccl_comm_t *grown = NULL;
    OK(jaccl_comm_grow(alive, 1, &grown));
    OK(jaccl_all_reduce(&v, &sum, 1, JACCL_INT32, JACCL_SUM, grown));
    if (sum != size) FAIL("all_reduce after grow: %d", (int)sum);
    OK(jaccl_comm_destroy(grown));
  }
  OK(jaccl_comm_destroy(alive));
}

/* The newcomer: joins with the invitation in the file JACCL_TEST_INVITATION names. */
static jaccl_comm_t *joined(void) {
  const char *path = getenv("JACCL_TEST_INVITATION");
  char invitation[256] = {0};
  for (int i = 0; i < 60000; i++) {
    FILE *f = fopen(path, "r");
    if (f) {
      if (!fgets(invitation, sizeof invitation, f)) FAIL("cannot read %s", path);
      fclose(f);
      break;
    }
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  if (!invitation[0]) FAIL("no invitation in %s", path);
  jaccl_config_t config;
  OK(jaccl_config_init(&config));
  config.join = invitation;
  config.job_token = getenv("JACCL_TEST_TOKEN");
  config.transport = getenv("JACCL_TRANSPORT"); /* the members' */
  jaccl_comm_t *comm = NULL;
  OK(jaccl_comm_init(&config, &comm));
  return comm;
}

/* Rank 0 aborts while no call is in flight: the others' next call fails with PEER_LOST
 * naming it, at once (not at a timeout); rank 0's calls fail with ABORTED. */
static void aborted(jaccl_comm_t *comm) {
  if (size < 2) FAIL("abort needs 2 ranks");
  OK(jaccl_comm_set_timeout(comm, 600.0));
  OK(jaccl_barrier(comm));
  float x[16] = {0}, y[16];
  if (rank == 0) {
    OK(jaccl_comm_abort(comm));
    FAILS(JACCL_ABORTED, "jaccl_comm_abort", jaccl_all_reduce(x, y, 16, JACCL_FLOAT32, JACCL_SUM, comm));
    FAILS(JACCL_ABORTED, "all_reduce", jaccl_all_reduce(x, y, 16, JACCL_FLOAT32, JACCL_SUM, comm));
    OK(jaccl_comm_abort(comm));
    return;
  }
  jaccl_result_t r = jaccl_all_reduce(x, y, 16, JACCL_FLOAT32, JACCL_SUM, comm);
  if (r != JACCL_PEER_LOST || !strstr(jaccl_get_last_error(), "lost rank 0"))
    FAIL("after rank 0 aborted: %s: %s", jaccl_get_error_string(r), jaccl_get_last_error());
}

static jaccl_comm_t *from_config(void) {
  jaccl_config_t config;
  OK(jaccl_config_init(&config));
  config.rank = atoi(getenv("JACCL_TEST_RANK"));
  config.size = atoi(getenv("JACCL_TEST_SIZE"));
  config.coordinator = getenv("JACCL_TEST_COORDINATOR");
  config.job_token = getenv("JACCL_TEST_TOKEN");
  config.transport = "tcp";
  config.wires = 2;
  config.timeout = 300.0;
  config.liveness = INFINITY;
  jaccl_comm_t *comm = NULL;
  OK(jaccl_comm_init(&config, &comm));
  return comm;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "all";
  int version = 0;
  OK(jaccl_get_version(&version));
  if (version != JACCL_VERSION_MAJOR * 10000 + JACCL_VERSION_MINOR * 100 + JACCL_VERSION_PATCH)
    FAIL("library version %d, header %d.%d.%d", version, JACCL_VERSION_MAJOR, JACCL_VERSION_MINOR,
         JACCL_VERSION_PATCH);
  jaccl_comm_t *comm = NULL;
  if (strcmp(mode, "config") == 0) {
    comm = from_config();
  } else if (strcmp(mode, "join") == 0) {
    comm = joined();
  } else {
    OK(jaccl_comm_init_env(&comm));
  }
  OK(jaccl_comm_rank(comm, &rank));
  OK(jaccl_comm_size(comm, &size));
  if (strcmp(mode, "join") == 0) {
    int32_t v = 1, sum = 0;
    OK(jaccl_all_reduce(&v, &sum, 1, JACCL_INT32, JACCL_SUM, comm));
    if (sum != size || rank != size - 1) FAIL("joined as rank %d of %d, sum %d", rank, size, (int)sum);
  } else if (strcmp(mode, "kill") == 0) {
    killed(comm);
  } else if (strcmp(mode, "abort") == 0) {
    aborted(comm);
  } else {
    reductions(comm);
    movements(comm);
    /* The same through the _start forms. */
    use_start = 1;
    movements(comm);
    use_start = 0;
    point_to_point(comm);
    started(comm);
    if (strcmp(mode, "all") == 0) {
      subgroups(comm);
      batch_beside_a_thread(comm);
      misuse(comm);
      disagreement(comm);
    }
  }
  OK(jaccl_comm_destroy(comm));
  OK(jaccl_comm_destroy(NULL));
  printf("rank %d: ok\n", rank);
  return 0;
}
