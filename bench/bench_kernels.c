/* bench_kernels.c - single-thread GFLOP/s of kvc_matmul_rows per ISA and weight
 * type, at the shapes of Qwen2.5-0.5B's FFN (896 <-> 4864), for decode
 * (n_tok = 1) and prefill (n_tok = 512). Not a test.
 *
 * Times are CPU time (per thread), so a busy machine skews them less; with
 * several threads the figure is per thread-second, not wall-clock.
 *
 * Decode is measured twice: "hot" re-reads one matrix (it stays in L3) and
 * "cold" cycles through copies totalling more than the L3, as a real decode
 * step does over a model's layers. The first line gives what one thread can
 * read from memory (a plain sum over COLD_BYTES) to compare the bracketed
 * decode GB/s with.
 *
 * Build: `cmake -DKVC_BENCH=ON` makes build/bench_kernels; by hand, from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -ffp-contract=off -Iinclude -Isrc -Isrc/kernels bench/bench_kernels.c \
 *       build/libkvchat.a -lm -lpthread -o bench_kernels
 * Run: ./bench_kernels [seconds-per-case, default 0.3] [threads, default 1] [isa] [type] */
#include "kernels.h"
#include "quant.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COLD_BYTES (256u << 20)   /* more than the L3 of the machines we run on */

/* CPU time of this process in microseconds: with one thread, the time the
 * kernel actually ran, so other load on the machine does not count. */
static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct {
    const kvc_weight *w;
    const float *x;
    int64_t n_tok, r0, r1;
    float *y, *scratch;
} job;

static void *run_job(void *p)
{
    job *j = p;
    kvc_matmul_rows(j->w, j->x, j->w->n_in, j->n_tok, j->y, j->w->n_out, j->r0, j->r1, j->scratch);
    return NULL;
}

/* One matmul over all rows, split among n_thr threads by rows (multiples of 16). */
static void matmul_all(const kvc_weight *w, const float *x, int64_t n_tok, float *y, float **scratch, int n_thr)
{
    job jobs[16];
    pthread_t th[16];
    int64_t per = (w->n_out / n_thr + 15) / 16 * 16;
    for (int t = 0; t < n_thr; t++) {
        int64_t r0 = KVC_MIN(w->n_out, per * t), r1 = t == n_thr - 1 ? w->n_out : KVC_MIN(w->n_out, per * (t + 1));
        jobs[t] = (job){ w, x, n_tok, r0, r1, y, scratch[t] };
        if (t > 0)
            pthread_create(&th[t], NULL, run_job, &jobs[t]);
    }
    run_job(&jobs[0]);
    for (int t = 1; t < n_thr; t++)
        pthread_join(th[t], NULL);
}

/* GB/s one thread reads from memory: the best of 5 sums over COLD_BYTES. */
static double read_bandwidth(void)
{
    const size_t n = COLD_BYTES / sizeof(uint64_t);
    uint64_t *buf = kvc_alloc_aligned(COLD_BYTES), sink = 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    double best = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        int64_t t0 = cpu_us();
        uint64_t s[8] = { 0 };
        for (size_t i = 0; i < n; i += 8)
            for (int j = 0; j < 8; j++)
                s[j] += buf[i + j];
        best = KVC_MIN(best, (double)(cpu_us() - t0) * 1e-6);
        for (int j = 0; j < 8; j++)
            sink += s[j];
    }
    kvc_free_aligned(buf);
    return sink == 1 ? 0 : (double)COLD_BYTES / best * 1e-9;
}

static double bench_case(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, bool cold,
                         double secs, int n_thr)
{
    size_t rb = kvc_row_size(type, n_in), bytes = rb * (size_t)n_out;
    int copies = cold ? (int)(COLD_BYTES / bytes + 1) : 1;
    uint8_t *data = kvc_alloc_aligned(bytes * (size_t)copies);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t k = 0; k < n_in; k++)
            row[k] = (float)((r * 31 + k * 17) % 101 - 50) * 0.001f;
        kvc_quantize_row_ref(type, row, data + rb * (size_t)r, n_in);
    }
    for (int c = 1; c < copies; c++)
        memcpy(data + bytes * (size_t)c, data, bytes);
    float *x = kvc_alloc_aligned(sizeof(float) * (size_t)(n_in * n_tok));
    float *y = kvc_alloc_aligned(sizeof(float) * (size_t)(n_out * n_tok));
    for (int64_t i = 0; i < n_in * n_tok; i++)
        x[i] = (float)(i % 13) * 0.01f;
    float *scratch[16];
    for (int t = 0; t < n_thr; t++)
        scratch[t] = kvc_alloc_aligned(sizeof(float) * kvc_matmul_scratch_floats(n_in));

    kvc_weight w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = data };
    matmul_all(&w, x, n_tok, y, scratch, n_thr);   /* warm up */
    /* the best of several trials of ~secs/8 each: a trial disturbed by other
     * load on the machine (cache, frequency) does not count */
    double s = 1e30;
    int64_t reps = 0, start = cpu_us();
    while (cpu_us() - start < (int64_t)(secs * 1e6 * n_thr)) {
        int64_t n = 0, t0 = cpu_us(), t1;
        do {
            w.data = data + bytes * (size_t)(reps++ % copies);
            matmul_all(&w, x, n_tok, y, scratch, n_thr);
            n++;
            t1 = cpu_us();
        } while (t1 - t0 < (int64_t)(secs * 1e6 / 8 * n_thr));
        s = KVC_MIN(s, (double)(t1 - t0) * 1e-6 / (double)n / n_thr);   /* per thread */
    }

    for (int t = 0; t < n_thr; t++)
        kvc_free_aligned(scratch[t]);
    kvc_free_aligned(data);
    kvc_free_aligned(x);
    kvc_free_aligned(y);
    free(row);
    return 2.0 * (double)n_in * (double)n_out * (double)n_tok / s * 1e-9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    int n_thr = argc > 2 ? atoi(argv[2]) : 1;
    n_thr = KVC_MAX(1, KVC_MIN(16, n_thr));
    const char *only_isa = argc > 3 ? argv[3] : NULL, *only_type = argc > 4 ? argv[4] : NULL;
    const uint32_t types[] = { KVC_TYPE_F32, KVC_TYPE_F16, KVC_TYPE_BF16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0,
                               KVC_TYPE_Q4_1, KVC_TYPE_Q5_0, KVC_TYPE_Q5_1,
                               KVC_TYPE_Q4_K, KVC_TYPE_Q5_K, KVC_TYPE_Q6_K };
    const int64_t shapes[][2] = { { 896, 4864 }, { 4864, 896 } };
    printf("memory read, 1 thread: %.1f GB/s\n", read_bandwidth());
    printf("GFLOP/s, %d thread(s); decode GB/s of weights in brackets\n", n_thr);
    printf("%-7s %-5s %-11s %16s %16s %10s\n", "isa", "type", "n_in->n_out", "decode hot", "decode cold", "prefill512");
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK ||
            (only_isa && strcmp(only_isa, kvc_isa_name((kvc_isa)isa)) != 0))
            continue;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (int s = 0; s < 2; s++) {
                const uint32_t type = types[ti];
                const int64_t n_in = shapes[s][0], n_out = shapes[s][1];
                if (kvc_row_size(type, n_in) == 0)
                    continue;     /* 896 is not a multiple of 256 */
                if (only_type && strcmp(only_type, kvc_type_info(type)->name) != 0)
                    continue;
                const double bpw = (double)kvc_row_size(type, n_in) / (double)n_in;  /* bytes per weight */
                double hot = bench_case(type, n_in, n_out, 1, false, secs, n_thr);
                double cold = bench_case(type, n_in, n_out, 1, true, secs, n_thr);
                double pre = isa == KVC_ISA_SCALAR && secs < 1 ? 0
                           : bench_case(type, n_in, n_out, 512, false, secs, n_thr);
                printf("%-7s %-5s %4lld->%-5lld %6.1f [%5.1f] %6.1f [%5.1f] %10.1f\n", kvc_isa_name((kvc_isa)isa),
                       kvc_type_info(type)->name, (long long)n_in, (long long)n_out, hot, hot / 2 * bpw, cold,
                       cold / 2 * bpw, pre);
                fflush(stdout);
            }
    }
    return 0;
}
