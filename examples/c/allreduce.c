/*
 * Averages a "gradient" over every rank with jaccl's C interface, then checks it.
 *
 *   scripts/install-c.sh                      # once: libjaccl, jaccl.h, jaccl.pc, the jaccl command
 *   cc allreduce.c $(pkg-config --cflags --libs jaccl) -o allreduce
 *   jaccl launch -n 4 ./allreduce             # or: mpirun -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./allreduce
 */
#include <jaccl.h>

#include <stdio.h>
#include <stdlib.h>

int main(void) {
  jaccl_comm_t *comm = NULL;
  /* Rank, size and coordinator from the launcher's environment. */
  if (jaccl_comm_init_env(&comm) != JACCL_SUCCESS) {
    fprintf(stderr, "jaccl: %s\n", jaccl_get_last_error());
    return 1;
  }
  int rank = 0, size = 1;
  jaccl_comm_rank(comm, &rank);
  jaccl_comm_size(comm, &size);

  /* Each rank's gradient: element i is rank + i. */
  const size_t n = 1 << 20;
  float *grad = malloc(n * sizeof *grad);
  if (grad == NULL) return 1;
  for (size_t i = 0; i < n; i++) grad[i] = (float)(rank + (int)i % 100);

  /* In place (sendbuf == recvbuf): the average over all ranks, the same bits on every rank. */
  jaccl_result_t r = jaccl_all_reduce(grad, grad, n, JACCL_FLOAT32, JACCL_AVG, comm);
  if (r != JACCL_SUCCESS) {
    /* The message names this rank, the operation and the cause (a lost peer names it). */
    fprintf(stderr, "%s: %s\n", jaccl_get_error_string(r), jaccl_comm_get_last_error(comm));
    jaccl_comm_destroy(comm);
    return 1;
  }

  /* The average of rank + i over ranks 0..size-1 is (size-1)/2 + i. */
  int wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong += grad[i] != (float)(size - 1) / 2.0f + (float)((int)i % 100);
  if (rank == 0) printf("all_reduce (average) of %zu floats on %d ranks: %s\n", n, size, wrong ? "WRONG" : "ok");

  free(grad);
  jaccl_comm_destroy(comm);
  return wrong != 0;
}
