/* MPI_Bcast, MPI_Alltoall, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Reduce, MPI_Gather,
 * MPI_Scatter, MPI_Allreduce and MPI_Barrier timed the way `jaccl bench --dtype u8` times
 * broadcast, all-to-all, all-gather, reduce-scatter, reduce, gather, scatter, all-reduce and
 * barrier (size 0), for
 * benches/compare_mpi.sh (the side-by-side with jaccl):
 *
 *   mpicc -O2 -o mpi_collectives benches/mpi_collectives.c -lm
 *   mpirun -np 4 ./mpi_collectives OP SIZES [TRANSPORT]
 *
 * OP: bcast, alltoall, allgather, reducescatter, reduce, gather, scatter, allreduce or barrier
 * (give it size 0); rooted
 * ones with root 0, reductions with MPI_SUM. SIZES: comma list of bytes (K/M suffixes): for
 * bcast, reduce and allreduce the message, for alltoall each rank's whole input (SIZE / N bytes
 * to every rank), for allgather the gathered output (SIZE / N bytes from every rank), for
 * reducescatter each rank's input (SIZE / N bytes come out), for gather the root's output and
 * for scatter the root's input (SIZE / N bytes from or to every rank), as in jaccl bench and
 * nccl-tests. Bytes (MPI_BYTE; MPI_UNSIGNED_CHAR where reduced, small enough that no sum
 * passes 255, see addend) with a pattern that puts rank, block and index in every byte,
 * checked after the first and the last operation (at the root alone for reduce and gather).
 * Per size: one checked operation; warm-up rounds of 1, 2, 4... operations until one takes
 * 50 ms (all ranks agree on the count); then enough operations for about 0.3 s; the time is
 * the slowest rank's mean. Rank 0 prints one JSON line per size.
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

/* Reductions: Open MPI 4.1's AVX op component adds u8 with saturation (open-mpi/ompi#8045),
 * so reduced bytes stay small enough that no sum passes 255: byte i of what rank `from`
 * reduces into block `to` is (from + pattern(0, to, i)) mod m, with (m - 1) * N <= 255. */
static int modulus(int n) { return n > 255 ? 1 : 255 / n + 1; }

static unsigned char addend(int n, int from, int to, long i) {
    return (unsigned char)((from + pattern(0, to, i)) % modulus(n));
}

/* sums[c]: the sum over all n ranks r of (r + c) mod m, for c < m. */
static void sum_table(int n, unsigned char *sums) {
    int m = modulus(n);
    for (int c = 0; c < m; c++) {
        long s = 0;
        for (int r = 0; r < n; r++) s += (r + c) % m;
        sums[c] = (unsigned char)s;
    }
}

typedef enum {
    BCAST, ALLTOALL, ALLGATHER, REDUCESCATTER, REDUCE, GATHER, SCATTER, ALLREDUCE, BARRIER
} Kind;
#define KINDS 9

static const char *const NAMES[KINDS] = {"bcast",  "alltoall", "allgather", "reducescatter",
                                         "reduce", "gather",   "scatter",   "allreduce",
                                         "barrier"};
static const char *const OPS[KINDS] = {"broadcast", "all-to-all", "all-gather", "reduce-scatter",
                                       "reduce",    "gather",     "scatter",    "all-reduce",
                                       "barrier"};

typedef struct {
    Kind kind;
    int rank, n;
    long bytes, block;
    unsigned char *in, *out;
    unsigned char sums[256]; /* sum_table(n) */
} Op;

static void run(Op *op) {
    int bytes = (int)op->bytes, block = (int)op->block;
    switch (op->kind) {
    case BCAST: MPI_Bcast(op->out, bytes, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case ALLTOALL:
        MPI_Alltoall(op->in, block, MPI_BYTE, op->out, block, MPI_BYTE, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(op->in, block, MPI_BYTE, op->out, block, MPI_BYTE, MPI_COMM_WORLD);
        break;
    case REDUCESCATTER:
        MPI_Reduce_scatter_block(op->in, op->out, block, MPI_UNSIGNED_CHAR, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
    case REDUCE:
        MPI_Reduce(op->in, op->out, bytes, MPI_UNSIGNED_CHAR, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
    case GATHER:
        MPI_Gather(op->in, block, MPI_BYTE, op->out, block, MPI_BYTE, 0, MPI_COMM_WORLD);
        break;
    case SCATTER:
        MPI_Scatter(op->in, block, MPI_BYTE, op->out, block, MPI_BYTE, 0, MPI_COMM_WORLD);
        break;
    case ALLREDUCE:
        MPI_Allreduce(op->in, op->out, bytes, MPI_UNSIGNED_CHAR, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    }
}

static long wrong(const Op *op) {
    long bad = 0;
    const unsigned char *out = op->out;
    switch (op->kind) {
    case BARRIER: break; /* Nothing to check: no data. */
    case BCAST:
        for (long i = 0; i < op->bytes; i++) bad += out[i] != pattern(0, 0, i);
        break;
    case REDUCE:
    case ALLREDUCE:
        if (op->kind == REDUCE && op->rank != 0) break;
        for (long i = 0; i < op->bytes; i++)
            bad += out[i] != op->sums[pattern(0, 0, i) % modulus(op->n)];
        break;
    case REDUCESCATTER: /* Block `rank` of every rank's input, summed. */
        for (long i = 0; i < op->block; i++)
            bad += out[i] != op->sums[pattern(0, op->rank, i) % modulus(op->n)];
        break;
    case SCATTER: /* Block `rank` of the root's input. */
        for (long i = 0; i < op->block; i++) bad += out[i] != pattern(0, op->rank, i);
        break;
    case ALLTOALL:
    case ALLGATHER:
    case GATHER: {
        /* All-to-all: block s came from rank s for this rank; (all-)gather: rank s's own. */
        if (op->kind == GATHER && op->rank != 0) break;
        int to = op->kind == ALLTOALL ? op->rank : 0;
        for (int s = 0; s < op->n; s++)
            for (long i = 0; i < op->block; i++) bad += out[s * op->block + i] != pattern(s, to, i);
        break;
    }
    }
    return bad;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int kind = 0;
    while (argc >= 3 && kind < KINDS && strcmp(argv[1], NAMES[kind])) kind++;
    if (argc < 3 || kind == KINDS) {
        if (!rank)
            fprintf(stderr, "usage: mpi_collectives bcast|alltoall|allgather|reducescatter|reduce|"
                            "gather|scatter|allreduce|barrier SIZES [TRANSPORT]\n");
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
        /* Cut into a block per rank: the whole is N blocks (jaccl bench's size column). */
        if (op.kind != BCAST && op.kind != REDUCE && op.kind != ALLREDUCE)
            op.bytes = op.block * n;
        op.in = malloc(op.bytes + 1);
        op.out = malloc(op.bytes + 1);
        if (!op.in || !op.out) MPI_Abort(MPI_COMM_WORLD, 3);
        for (long i = 0; i < op.bytes; i++)
            op.out[i] = op.kind == BCAST && rank == 0 ? pattern(0, 0, i) : 0xee;
        /* Inputs: a block per destination d (all-to-all, reduce-scatter, the root's of
         * scatter), one block (all-gather, gather) or the whole message (reduce, all-reduce). */
        int blocks_to = op.kind == ALLTOALL || (op.kind == SCATTER && rank == 0);
        for (int d = 0; d < n && blocks_to; d++)
            for (long i = 0; i < op.block; i++) op.in[d * op.block + i] = pattern(rank, d, i);
        for (int d = 0; d < n && op.kind == REDUCESCATTER; d++)
            for (long i = 0; i < op.block; i++) op.in[d * op.block + i] = addend(n, rank, d, i);
        if (op.kind == ALLGATHER || op.kind == GATHER)
            for (long i = 0; i < op.block; i++) op.in[i] = pattern(rank, 0, i);
        if (op.kind == REDUCE || op.kind == ALLREDUCE)
            for (long i = 0; i < op.bytes; i++) op.in[i] = addend(n, rank, 0, i);
        sum_table(n, op.sums);
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
            /* nccl-tests' bus factors, as jaccl bench's BenchOp::bus_factor. */
            double factor = op.kind == BCAST || op.kind == REDUCE ? 1.0
                            : op.kind == ALLREDUCE           ? 2.0 * (n - 1) / n
                                                             : (double)(n - 1) / n;
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
