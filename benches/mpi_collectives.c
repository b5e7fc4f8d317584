/* MPI_Bcast, MPI_Alltoall and MPI_Allgather timed the way `jaccl bench` times broadcast,
 * all-to-all and all-gather, for benches/compare_mpi.sh (the side-by-side with jaccl):
 *
 *   mpicc -O2 -o mpi_collectives benches/mpi_collectives.c
 *   mpirun -np 4 ./mpi_collectives bcast|alltoall|allgather SIZES [TRANSPORT]
 *
 * SIZES: comma list of bytes (K/M suffixes): for bcast the message, for alltoall each rank's
 * whole input (SIZE / N bytes to every rank), for allgather the gathered output (SIZE / N bytes
 * from every rank), as in jaccl bench and nccl-tests. Bytes (MPI_BYTE)
 * with a pattern that puts rank, block and index in every byte, checked after the first and the
 * last operation. Per size: one checked operation; warm-up rounds of 1, 2, 4... operations until
 * one takes 50 ms (all ranks agree on the count); then enough operations for about 0.3 s; the
 * time is the slowest rank's mean. Rank 0 prints one JSON line per size.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long parse_size(const char *t) {
    char *end;
    long v = strtol(t, &end, 10);
    if (end == t || v < 0) return -1;
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    else if (*end != 0 && *end != 'B' && *end != 'b') return -1;
    return v;
}

static double max_over_ranks(double v) {
    double r;
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return r;
}

/* Byte i of what rank `from` holds for rank `to`. */
static unsigned char pattern(int from, int to, long i) {
    return (unsigned char)(from * 31 + to * 7 + i * 13 + (i >> 8));
}

typedef enum { BCAST, ALLTOALL, ALLGATHER } Kind;

static const char *const NAMES[] = {"bcast", "alltoall", "allgather"};
static const char *const OPS[] = {"broadcast", "all-to-all", "all-gather"};

typedef struct {
    Kind kind;
    int rank, n;
    long bytes, block;
    unsigned char *in, *out;
} Op;

static void run(Op *op) {
    if (op->kind == BCAST)
        MPI_Bcast(op->out, (int)op->bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    else if (op->kind == ALLTOALL)
        MPI_Alltoall(op->in, (int)op->block, MPI_BYTE, op->out, (int)op->block, MPI_BYTE,
                     MPI_COMM_WORLD);
    else
        MPI_Allgather(op->in, (int)op->block, MPI_BYTE, op->out, (int)op->block, MPI_BYTE,
                      MPI_COMM_WORLD);
}

static long wrong(const Op *op) {
    long bad = 0;
    if (op->kind == BCAST) {
        for (long i = 0; i < op->bytes; i++) bad += op->out[i] != pattern(0, 0, i);
    } else {
        /* All-to-all: block s came from rank s for this rank; all-gather: rank s's own. */
        int to = op->kind == ALLTOALL ? op->rank : 0;
        for (int s = 0; s < op->n; s++)
            for (long i = 0; i < op->block; i++)
                bad += op->out[s * op->block + i] != pattern(s, to, i);
    }
    return bad;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int kind = 0;
    while (argc >= 3 && kind < 3 && strcmp(argv[1], NAMES[kind])) kind++;
    if (argc < 3 || kind == 3) {
        if (!rank)
            fprintf(stderr, "usage: mpi_collectives bcast|alltoall|allgather SIZES [TRANSPORT]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *transport = argc > 3 ? argv[3] : "default";
    char *sizes = strdup(argv[2]), *save = NULL;
    for (char *tok = strtok_r(sizes, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        Op op = {.kind = (Kind)kind, .rank = rank, .n = n};
        op.bytes = parse_size(tok);
        if (op.bytes < 0) {
            if (!rank) fprintf(stderr, "bad size %s\n", tok);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        op.block = op.bytes / n;
        if (op.kind != BCAST) op.bytes = op.block * n;
        op.in = malloc(op.bytes + 1);
        op.out = malloc(op.bytes + 1);
        if (!op.in || !op.out) MPI_Abort(MPI_COMM_WORLD, 3);
        for (long i = 0; i < op.bytes; i++)
            op.out[i] = op.kind == BCAST && rank == 0 ? pattern(0, 0, i) : 0xee;
        for (int d = 0; d < n && op.kind == ALLTOALL; d++)
            for (long i = 0; i < op.block; i++) op.in[d * op.block + i] = pattern(rank, d, i);
        for (long i = 0; i < op.block && op.kind == ALLGATHER; i++) op.in[i] = pattern(rank, 0, i);
        run(&op);
        long bad = wrong(&op);

        long k = 1;
        double took;
        for (;;) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long i = 0; i < k; i++) run(&op);
            took = max_over_ranks(MPI_Wtime() - t0);
            if (took >= 0.05 || k >= (1L << 16)) break;
            k *= 2;
        }
        double per_op = took / k;
        long iters = (long)ceil(0.3 / (per_op > 1e-9 ? per_op : 1e-9));
        if (iters < 5) iters = 5;
        if (iters > 100000) iters = 100000;
        iters = (long)max_over_ranks((double)iters);

        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++) run(&op);
        double time = max_over_ranks((MPI_Wtime() - t0) / iters);
        bad += wrong(&op);
        double any_bad = max_over_ranks((double)bad);
        if (rank == 0) {
            double algbw = op.bytes / time / 1e9;
            double factor = op.kind == BCAST ? 1.0 : (double)(n - 1) / n;
            printf("{\"peer\": \"openmpi\", \"op\": \"%s\", \"transport\": \"%s\", \"n\": %d, "
                   "\"bytes\": %ld, \"time_us\": %.6g, \"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, "
                   "\"iters\": %ld, \"ok\": %s}\n",
                   OPS[op.kind], transport, n, op.bytes, time * 1e6,
                   algbw, algbw * factor, iters, any_bad == 0.0 ? "true" : "false");
            fflush(stdout);
        }
        free(op.in);
        free(op.out);
    }
    free(sizes);
    MPI_Finalize();
    return 0;
}
