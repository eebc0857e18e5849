/* bench_block_store.c - write and read throughput of the disk tier
 * (block_store_disk.c) with blocks of a Qwen2.5-0.5B shape in F16: 24 layers,
 * 2 KV heads of 64, 16 tokens = 196,608 bytes of K/V a block. Not a test.
 *
 * put: N blocks into an empty directory (temp file + rename each).
 * get, warm: every block read back and verified (checksum, tokens, parent)
 *   with the files in the page cache.
 * get, cold: the same after posix_fadvise(DONTNEED) on every file, so the
 *   bytes come from the device (as after a reboot; a restart of the server
 *   alone usually finds them warm).
 * open: the index rebuilt from the directory (a restart).
 *
 * Build: `cmake -DKVC_BENCH=ON` makes build/bench_block_store; by hand, from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -Isrc/cache bench/bench_block_store.c \
 *       build/libkvchat.a -lxxhash -lm -lpthread -o bench_block_store
 * Run: ./bench_block_store DIR [blocks, default 512] */
#include "block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define B        16
#define KV_BYTES (24 * 2 * 2 * B * 64 * 2)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void desc_of(uint64_t i, int32_t *tokens, kvc_block_desc *d)
{
    for (int k = 0; k < B; k++)
        tokens[k] = (int32_t)(i * 31 + (uint64_t)k);
    *d = (kvc_block_desc){ 0x9e3779b97f4a7c15ull * (i + 1), i, B, tokens };
}

static void drop_page_cache(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    if (d)
        closedir(d);
}

static double read_all(kvc_block_store *bs, int n, uint8_t *kv)
{
    int32_t tokens[B];
    kvc_block_desc d;
    kvc_err e = { 0 };
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        desc_of((uint64_t)i, tokens, &d);
        if (kvc_bs_get(bs, &d, kv, KV_BYTES, &e) != KVC_OK) {
            fprintf(stderr, "get %d: %s\n", i, e.msg);
            exit(1);
        }
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [blocks]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 512;
    kvc_disk_store_params p = { dir, 0, false };
    kvc_block_store *bs = NULL;
    kvc_err e = { 0 };
    if (kvc_disk_store_open(&p, &bs, &e) != KVC_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    uint8_t *kv = malloc(KV_BYTES);
    for (size_t i = 0; i < KV_BYTES; i++)
        kv[i] = (uint8_t)(i * 131 + 7);
    int32_t tokens[B];
    kvc_block_desc d;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        desc_of((uint64_t)i, tokens, &d);
        if (kvc_bs_put(bs, &d, kv, KV_BYTES, &e) != KVC_OK) {
            fprintf(stderr, "put %d: %s\n", i, e.msg);
            return 1;
        }
    }
    double t_put = now_s() - t0;
    double t_warm = read_all(bs, n, kv);
    kvc_bs_close(bs);
    drop_page_cache(dir);
    t0 = now_s();
    if (kvc_disk_store_open(&p, &bs, &e) != KVC_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    double t_open = now_s() - t0;
    drop_page_cache(dir);
    double t_cold = read_all(bs, n, kv);
    kvc_bs_close(bs);
    double mib = (double)n * KV_BYTES / (1 << 20);
    printf("%d blocks of %d bytes (%.0f MiB, %d tokens of a Qwen2.5-0.5B shape in F16)\n", n,
           KV_BYTES, mib, n * B);
    printf("  put          %8.1f MiB/s  %8.0f blocks/s  %7.3f ms a block\n", mib / t_put,
           n / t_put, t_put * 1e3 / n);
    printf("  get, warm    %8.1f MiB/s  %8.0f blocks/s  %7.3f ms a block\n", mib / t_warm,
           n / t_warm, t_warm * 1e3 / n);
    printf("  get, cold    %8.1f MiB/s  %8.0f blocks/s  %7.3f ms a block\n", mib / t_cold,
           n / t_cold, t_cold * 1e3 / n);
    printf("  open (index) %8.1f ms for %d files\n", t_open * 1e3, n);
    free(kv);
    return 0;
}
