/*
 * fuzz_driver.c - runs a libFuzzer target without libFuzzer: replays every
 * file of a seed corpus directory, then deterministic random mutations of
 * them (byte flips, truncations, insertions), so CTest exercises every
 * parser on every build.  `make fuzz` runs the real coverage-guided fuzzer.
 * Usage: fuzz_X CORPUS_DIR [ITERATIONS]
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A seed corpus holds at most this many files (`make fuzz` grows the
 * directories; merge them with -merge=1 before committing). */
#define FUZZ_MAX_SEEDS 1024

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs the target on a copy of exactly len bytes, so ASan sees any read
 * past the input (a file's buffer may carry a terminator). */
static void run_exact(const uint8_t *data, size_t len)
{
    uint8_t *exact = malloc(len ? len : 1);

    if (exact == NULL)
        abort();
    memcpy(exact, data, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
}

int main(int argc, char **argv)
{
    /* The seeds in name order, so the mutations are the same on every
     * file system (readdir's order is not). */
    char *names[FUZZ_MAX_SEEDS], *seeds[FUZZ_MAX_SEEDS];
    size_t seed_len[FUZZ_MAX_SEEDS];
    int n_names = 0, n_seeds = 0;
    long iterations = argc > 2 ? atol(argv[2]) : 3000;
    uint8_t *buf;
    DIR *dir;
    struct dirent *de;

    bt_log_init("fuzz");
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR [ITERATIONS]\n", argv[0]);
        return 2;
    }
    dir = opendir(argv[1]);
    if (dir == NULL) {
        fprintf(stderr, "cannot open corpus %s\n", argv[1]);
        return 1;
    }
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n_names == FUZZ_MAX_SEEDS) {
            fprintf(stderr, "corpus %s holds more than %d files\n", argv[1],
                    FUZZ_MAX_SEEDS);
            return 1;
        }
        names[n_names] = strdup(de->d_name);
        if (names[n_names] == NULL)
            abort();
        n_names++;
    }
    closedir(dir);
    qsort(names, (size_t)n_names, sizeof(names[0]), name_cmp);
    for (int i = 0; i < n_names; i++) {
        char path[4096];

        snprintf(path, sizeof(path), "%s/%s", argv[1], names[i]);
        if (bt_read_file(path, 1 << 24, &seeds[n_seeds],
                         &seed_len[n_seeds]) == BT_OK)
            n_seeds++;
        free(names[i]);
    }
    if (n_seeds == 0) {
        fprintf(stderr, "empty corpus %s\n", argv[1]);
        return 1;
    }
    for (int i = 0; i < n_seeds; i++)
        run_exact((const uint8_t *)seeds[i], seed_len[i]);
    for (long it = 0; it < iterations; it++) {
        int s = (int)(rng_next() % (uint32_t)n_seeds);
        size_t len = seed_len[s], cap = len + 64;
        int n_mut = 1 + (int)(rng_next() % 8);

        buf = malloc(cap);
        if (buf == NULL)
            abort();
        memcpy(buf, seeds[s], len);
        for (int m = 0; m < n_mut; m++) {
            uint32_t kind = rng_next() % 4;
            if (kind == 0 && len > 0) { /* flip a byte */
                buf[rng_next() % len] ^= (uint8_t)(1u << (rng_next() % 8));
            } else if (kind == 1 && len > 0) { /* random byte */
                buf[rng_next() % len] = (uint8_t)rng_next();
            } else if (kind == 2 && len > 0) { /* truncate */
                len = rng_next() % len;
            } else if (len < cap) { /* insert */
                size_t at = len ? rng_next() % len : 0;
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = (uint8_t)rng_next();
                len++;
            }
        }
        run_exact(buf, len);
        free(buf);
    }
    for (int i = 0; i < n_seeds; i++)
        bt_free(seeds[i]);
    printf("fuzz: %d seeds, %ld mutations, no crash\n", n_seeds, iterations);
    return 0;
}
