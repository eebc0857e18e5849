/* bench_decode.c - GB/s of weights the single-token matmul (decode) reads, per
 * weight type and matrix shape, with 1 and 2 threads, against what a plain
 * streaming read gets from memory with as many threads. Not a test.
 *
 * Decode reads every weight once per token and does little arithmetic per
 * byte, so its speed is the bytes of the matrix over the time: the closer to
 * the streaming read, the better. Each case cycles through copies of the
 * matrix totalling more than the L3 ("cold", as a decode step over a model's
 * layers), times the wall clock (threads run at once), and keeps the best of
 * several trials (a shared machine disturbs some). The threads split the rows
 * in halves rounded to kvc_matmul_act_row_group (forward.c's pool takes
 * smaller ranges dynamically), the activations quantized once per product
 * (kvc_matmul_act_quantize), as forward.c does.
 *
 * Environment: HOT=1 keeps one copy of the matrix (read from cache: the
 * kernel's own speed); CPUTIME=1 times the process's CPU time instead of the
 * wall clock (steadier on a busy machine; with 2 threads it counts the
 * waiting thread too); N_IN=n keeps the shapes of that n_in; N_OUT=n
 * overrides n_out (N_OUT=512 N_IN=2048 HOT=1 CPUTIME=1: a matrix that fits
 * in L2, the figure that repeats on a shared machine).
 *
 * Build: cmake -DKVC_BENCH=ON (build/bench_decode).
 * Run: ./bench_decode [seconds-per-case, default 0.4] [type] [isa]
 *   e.g. ./bench_decode 0.4 q4_K vnni */
#include "kernels.h"
#include "quant.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COLD_BYTES (384u << 20)   /* more than the L3 of the machines we run on */
#define MAX_THR    2

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(getenv("CPUTIME") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------- a pair of worker threads */

typedef struct worker {
    pthread_t         th;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    int               gen, done, quit;
    void            (*fn)(void *, int);
    void             *arg;
} worker;

static worker W[MAX_THR];

static void *worker_main(void *p)
{
    worker *w = p;
    int seen = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->gen == seen && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        seen = w->gen;
        pthread_mutex_unlock(&w->mu);
        w->fn(w->arg, (int)(w - W));
        __atomic_store_n(&w->done, seen, __ATOMIC_RELEASE);
    }
}

/* fn(arg, i) for i < n, thread 0 on the caller; the others spin-wait done. */
static void run_all(int n, void (*fn)(void *, int), void *arg)
{
    for (int i = 1; i < n; i++) {
        pthread_mutex_lock(&W[i].mu);
        W[i].fn = fn;
        W[i].arg = arg;
        W[i].gen++;
        pthread_cond_signal(&W[i].cv);
        pthread_mutex_unlock(&W[i].mu);
    }
    fn(arg, 0);
    for (int i = 1; i < n; i++)
        while (__atomic_load_n(&W[i].done, __ATOMIC_ACQUIRE) != W[i].gen)
            ;
}

/* ------------------------------------------------------------ memory read */

typedef struct {
    const uint64_t *buf;
    size_t n;
    int n_thr;
    uint64_t sink[MAX_THR * 8];
} read_job;

static void read_part(void *p, int i)
{
    read_job *j = p;
    const size_t per = j->n / (size_t)j->n_thr, a = per * (size_t)i;
    uint64_t s[8] = { 0 };
    for (size_t k = a; k < a + per; k += 8)
        for (int l = 0; l < 8; l++)
            s[l] += j->buf[k + l];
    j->sink[i * 8] += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

/* GB/s n_thr threads read from memory: the best of 5 sums over COLD_BYTES. */
static double read_bandwidth(int n_thr)
{
    read_job j = { .n = COLD_BYTES / sizeof(uint64_t), .n_thr = n_thr };
    uint64_t *buf = kvc_alloc_aligned(COLD_BYTES);
    for (size_t i = 0; i < j.n; i++)
        buf[i] = i;
    j.buf = buf;
    double best = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        const double t0 = now_s();
        run_all(n_thr, read_part, &j);
        best = KVC_MIN(best, now_s() - t0);
    }
    kvc_free_aligned(buf);
    return (double)COLD_BYTES / best * 1e-9 + (j.sink[0] == 1 ? 1e-30 : 0);
}

/* ----------------------------------------------------------------- decode */

typedef struct {
    kvc_weight w;
    const float *x;
    void *act;           /* quantized x, or NULL: kvc_matmul_rows */
    float *y;
    float *scratch[MAX_THR];
    int n_thr;
} mm_job;

static void mm_part(void *p, int i)
{
    mm_job *j = p;
    const int64_t g = KVC_MAX(1, kvc_matmul_act_row_group(1)), n = j->w.n_out;
    const int64_t half = (n / j->n_thr + g - 1) / g * g;
    const int64_t r0 = KVC_MIN(n, half * i), r1 = i == j->n_thr - 1 ? n : KVC_MIN(n, half * (i + 1));
    if (j->act)
        kvc_matmul_rows_act(&j->w, j->act, 1, j->y, n, r0, r1, j->scratch[i]);
    else
        kvc_matmul_rows(&j->w, j->x, j->w.n_in, 1, j->y, n, r0, r1, j->scratch[i]);
}

/* GB/s of weights read by decode of one token through an n_in x n_out matrix. */
static double bench_case(uint32_t type, int64_t n_in, int64_t n_out, double secs, int n_thr)
{
    const size_t rb = kvc_row_size(type, n_in), bytes = rb * (size_t)n_out;
    const int copies = getenv("HOT") ? 1 : (int)(COLD_BYTES / bytes + 1);
    uint8_t *data = kvc_alloc_aligned(bytes * (size_t)copies);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < KVC_MIN(n_out, 64); r++) {
        for (int64_t k = 0; k < n_in; k++)
            row[k] = (float)((r * 31 + k * 17) % 101 - 50) * 0.001f;
        kvc_quantize_row_ref(type, row, data + rb * (size_t)r, n_in);
    }
    for (int64_t r = 64; r < n_out; r++)    /* the other rows repeat the first 64 */
        memcpy(data + rb * (size_t)r, data + rb * (size_t)(r % 64), rb);
    for (int c = 1; c < copies; c++)
        memcpy(data + bytes * (size_t)c, data, bytes);
    mm_job j = { .w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = data },
                 .n_thr = n_thr };
    float *x = kvc_alloc_aligned(sizeof(float) * (size_t)n_in);
    for (int64_t i = 0; i < n_in; i++)
        x[i] = (float)(i % 13) * 0.01f - 0.05f;
    j.x = x;
    j.y = kvc_alloc_aligned(sizeof(float) * (size_t)n_out);
    for (int t = 0; t < n_thr; t++)
        j.scratch[t] = kvc_alloc_aligned(sizeof(float) * kvc_matmul_scratch_floats(n_in));
    const size_t ab = kvc_matmul_act_bytes(n_in, 1);
    if (ab && kvc_matmul_uses_act(&j.w)) {
        j.act = kvc_alloc_aligned(ab);
        kvc_matmul_act_quantize(n_in, x, n_in, 1, 0, 1, j.act);
    }
    run_all(n_thr, mm_part, &j);   /* warm up */
    double best = 1e30, start = now_s();
    int64_t reps = 0;
    while (now_s() - start < secs) {
        int64_t n = 0;
        const double t0 = now_s();
        double t1;
        do {
            j.w.data = data + bytes * (size_t)(reps++ % copies);
            if (j.act)        /* as forward.c does once per product */
                kvc_matmul_act_quantize(n_in, x, n_in, 1, 0, 1, j.act);
            run_all(n_thr, mm_part, &j);
            n++;
            t1 = now_s();
        } while (t1 - t0 < secs / 8);
        best = KVC_MIN(best, (t1 - t0) / (double)n);
    }
    for (int t = 0; t < n_thr; t++)
        kvc_free_aligned(j.scratch[t]);
    if (j.act)
        kvc_free_aligned(j.act);
    kvc_free_aligned(data);
    kvc_free_aligned(x);
    kvc_free_aligned(j.y);
    free(row);
    return (double)bytes / best * 1e-9;
}

int main(int argc, char **argv)
{
    const double secs = argc > 1 ? atof(argv[1]) : 0.4;
    const char *only_type = argc > 2 ? argv[2] : NULL, *only_isa = argc > 3 ? argv[3] : NULL;
    for (int i = 1; i < MAX_THR; i++) {
        pthread_mutex_init(&W[i].mu, NULL);
        pthread_cond_init(&W[i].cv, NULL);
        pthread_create(&W[i].th, NULL, worker_main, &W[i]);
    }
    if (only_isa) {
        int isa = -1;
        for (int k = KVC_ISA_SCALAR; k <= KVC_ISA_VNNI; k++)
            if (strcmp(only_isa, kvc_isa_name((kvc_isa)k)) == 0)
                isa = k;
        if (isa < 0 || kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK) {
            fprintf(stderr, "bench_decode: ISA %s not available\n", only_isa);
            return 2;
        }
    }
    const uint32_t types[] = { KVC_TYPE_Q4_K, KVC_TYPE_Q5_K, KVC_TYPE_Q6_K, KVC_TYPE_Q8_0, KVC_TYPE_MXFP4 };
    /* n_in, n_out: Qwen3-30B-A3B's expert up and down, Qwen3.5-9B's FFN up,
     * Qwen3's output, gpt-oss's expert and output */
    const int64_t shapes[][2] = { { 2048, 768 }, { 768, 2048 }, { 4096, 12288 }, { 2048, 151936 },
                                  { 2880, 2880 }, { 2880, 201088 } };
    double bw[MAX_THR + 1];
    for (int t = 1; t <= MAX_THR; t++)
        bw[t] = read_bandwidth(t);
    printf("isa %s; memory read: 1 thread %.1f GB/s, 2 threads %.1f GB/s\n", kvc_isa_name(kvc_kernels_isa()),
           bw[1], bw[2]);
    printf("%-6s %-13s %10s %6s %10s %6s\n", "type", "n_in x n_out", "1 thr GB/s", "/read", "2 thr GB/s", "/read");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const uint32_t type = types[ti];
            const int64_t n_in = shapes[s][0];
            const int64_t n_out = getenv("N_OUT") ? atoll(getenv("N_OUT")) : shapes[s][1];
            if (kvc_row_size(type, n_in) == 0)
                continue;          /* n_in not a multiple of the type's block */
            if (only_type && strcmp(only_type, kvc_type_info(type)->name) != 0)
                continue;
            if (getenv("N_IN") && atoll(getenv("N_IN")) != n_in)
                continue;
            const double g1 = bench_case(type, n_in, n_out, secs, 1), g2 = bench_case(type, n_in, n_out, secs, 2);
            printf("%-6s %5lldx%-7lld %10.1f %5.0f%% %10.1f %5.0f%%\n", kvc_type_info(type)->name, (long long)n_in,
                   (long long)n_out, g1, 100 * g1 / bw[1], g2, 100 * g2 / bw[2]);
            fflush(stdout);
        }
    for (int i = 1; i < MAX_THR; i++) {
        pthread_mutex_lock(&W[i].mu);
        W[i].quit = 1;
        pthread_cond_signal(&W[i].cv);
        pthread_mutex_unlock(&W[i].mu);
        pthread_join(W[i].th, NULL);
    }
    return 0;
}
