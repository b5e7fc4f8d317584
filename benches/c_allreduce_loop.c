/*
 * The all-reduce loop of benches/c_overhead.sh through the C interface: `BYTES ITERS` (f32
 * sum, out of place, after ITERS/10 warm-up calls); rank 0 prints the mean microseconds per
 * call, timed between two barriers. crates/jaccl/examples/allreduce_loop.rs is the same loop
 * through the Rust API.
 */
#include <jaccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CHECK(call)                                                     \
  do {                                                                  \
    if ((call) != JACCL_SUCCESS) {                                      \
      fprintf(stderr, "%s: %s\n", #call, jaccl_get_last_error());      \
      return 1;                                                         \
    }                                                                   \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_allreduce_loop BYTES ITERS\n");
    return 2;
  }
  size_t count = (size_t)strtoull(argv[1], NULL, 10) / sizeof(float);
  long iters = strtol(argv[2], NULL, 10);
  jaccl_comm_t *comm = NULL;
  CHECK(jaccl_comm_init_env(&comm));
  int rank = 0;
  CHECK(jaccl_comm_rank(comm, &rank));
  float *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
  for (size_t i = 0; i < count; i++) in[i] = (float)(rank + 1);
  for (long i = 0; i < iters / 10 + 1; i++)
    CHECK(jaccl_all_reduce(in, out, count, JACCL_FLOAT32, JACCL_SUM, comm));
  CHECK(jaccl_barrier(comm));
  double start = now();
  for (long i = 0; i < iters; i++)
    CHECK(jaccl_all_reduce(in, out, count, JACCL_FLOAT32, JACCL_SUM, comm));
  CHECK(jaccl_barrier(comm));
  double elapsed = now() - start;
  if (rank == 0) printf("us_per_call %.3f\n", elapsed / (double)iters * 1e6);
  free(in);
  free(out);
  return jaccl_comm_destroy(comm) != JACCL_SUCCESS;
}
