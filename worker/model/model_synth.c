/*
 * model_synth.c - seeded random models of named shapes (see model_synth.h).
 *
 * All weights live in one 64-byte aligned arena.  The fill is split into
 * chunks of SYNTH_CHUNK elements; chunk c of tensor t draws from a PRNG
 * seeded with hash(seed, t, c), and threads take chunks from an atomic
 * counter, so the bytes do not depend on how many threads ran.
 */
#include "model_synth.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "model_int.h"

#define SYNTH_CHUNK (1 << 16)  /* elements per PRNG stream */
#define SYNTH_STD 0.02f        /* weight standard deviation */
#define SYNTH_MAX_THREADS 64

// ----------------------------------------------------------------------------
// named shapes

typedef struct {
    const char *name;  /* shape name used in synth:NAME */
    const char *arch;  /* architecture recorded in the model */
    const char *desc;  /* one line for help texts */
    bool big;          /* default dtype bf16 (else f32) */
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, ctx;
    float theta;       /* rope_theta */
    float eps;         /* rms_norm_eps */
    bool tied;         /* tie_word_embeddings */
    bool qkv_bias;     /* Qwen2 biases */
    int bos;           /* bos id */
    int eos[2];        /* stop ids */
    int n_eos;         /* entries used in eos */
    float llama3_factor; /* Llama 3.x rope scaling factor (8 in 3.1, 32 in
                            3.2); 0: none */
} synth_shape_t;

static const synth_shape_t synth_shapes[] = {
    { "tiny", "LlamaForCausalLM", "dim 64, 2 layers, 4 heads / 2 kv, vocab "
      "512, untied, f32", false, 64, 172, 2, 4, 2, 512, 256, 10000.0f, 1e-5f,
      false, false, 1, { 2, 0 }, 1, 0.0f },
    { "tiny-gqa", "LlamaForCausalLM", "dim 128, 3 layers, 8 heads / 2 kv, "
      "vocab 512, tied, f32", false, 128, 344, 3, 8, 2, 512, 256, 10000.0f,
      1e-5f, true, false, 1, { 2, 0 }, 1, 0.0f },
    { "tiny-h128", "LlamaForCausalLM", "dim 512, 2 layers, 4 heads / 2 kv "
      "of 128 dims, vocab 512, untied, f32", false,
      512, 1376, 2, 4, 2, 512, 1024, 500000.0f, 1e-5f, false, false, 1,
      { 2, 0 }, 1, 0.0f },
    { "tiny-qwen2", "Qwen2ForCausalLM", "dim 64, 2 layers, 4 heads / 2 kv, "
      "q/k/v bias, tied, f32", false, 64, 160, 2, 4, 2, 512, 256, 1e6f,
      1e-6f, true, true, 1, { 2, 0 }, 1, 0.0f },
    { "llama2-7b", "LlamaForCausalLM", "Llama 2 7B: 4096, 32 layers, 32 "
      "heads, vocab 32000", true, 4096, 11008, 32, 32, 32, 32000, 4096,
      10000.0f, 1e-5f, false, false, 1, { 2, 0 }, 1, 0.0f },
    { "llama3-8b", "LlamaForCausalLM", "Llama 3 8B: 4096, 32 layers, 32 "
      "heads / 8 kv, vocab 128256", true, 4096, 14336, 32, 32, 8, 128256,
      8192, 500000.0f, 1e-5f, false, false, 128000, { 128001, 128009 }, 2,
      0.0f },
    { "llama3.1-8b", "LlamaForCausalLM", "Llama 3.1 8B: llama3-8b with "
      "llama3 rope scaling, ctx 131072", true, 4096, 14336, 32, 32, 8,
      128256, 131072, 500000.0f, 1e-5f, false, false, 128000,
      { 128001, 128009 }, 2, 8.0f },
    { "llama3-70b", "LlamaForCausalLM", "Llama 3 70B: 8192, 80 layers, 64 "
      "heads / 8 kv, vocab 128256", true, 8192, 28672, 80, 64, 8, 128256,
      8192, 500000.0f, 1e-5f, false, false, 128000, { 128001, 128009 }, 2,
      0.0f },
    { "llama3.2-1b", "LlamaForCausalLM", "Llama 3.2 1B: 2048, 16 layers, "
      "32 heads / 8 kv of 64 dims, tied, rope scaling 32", true, 2048, 8192,
      16, 32, 8, 128256, 131072, 500000.0f, 1e-5f, true, false, 128000,
      { 128001, 128009 }, 2, 32.0f },
    { "qwen2-0.5b", "Qwen2ForCausalLM", "Qwen2 0.5B: 896, 24 layers, 14 "
      "heads / 2 kv, q/k/v bias, tied", true, 896, 4864, 24, 14, 2, 151936,
      32768, 1000000.0f, 1e-6f, true, true, 151643, { 151643, 151645 }, 2,
      0.0f },
};

int model_synth_shape_count(void)
{
    return (int)BT_ARRAY_SIZE(synth_shapes);
}

const char *model_synth_shape_name(int i)
{
    return i >= 0 && i < model_synth_shape_count() ? synth_shapes[i].name
                                                   : NULL;
}

const char *model_synth_shape_desc(int i)
{
    return i >= 0 && i < model_synth_shape_count() ? synth_shapes[i].desc
                                                   : NULL;
}

static const synth_shape_t *synth_find(const char *name)
{
    for (size_t i = 0; i < BT_ARRAY_SIZE(synth_shapes); i++) {
        if (strcmp(synth_shapes[i].name, name) == 0)
            return &synth_shapes[i];
    }
    return NULL;
}

bt_status_t model_synth_shape_config(const char *shape, model_config_t *cfg_p,
                                     const char **arch_p)
{
    const synth_shape_t *s = synth_find(shape);
    model_config_t cfg;

    if (s == NULL)
        return BT_ERROR(BT_ERR_NOT_FOUND, "MODEL",
                        "unknown synth shape \"%.64s\" (tiny, tiny-gqa, "
                        "tiny-qwen2, llama2-7b, llama3-8b, llama3.1-8b, "
                        "llama3.2-1b, llama3-70b, qwen2-0.5b)", shape);
    memset(&cfg, 0, sizeof(cfg));
    cfg.dim = s->dim;
    cfg.hidden_dim = s->hidden_dim;
    cfg.n_layers = s->n_layers;
    cfg.n_heads = s->n_heads;
    cfg.n_kv_heads = s->n_kv_heads;
    cfg.head_dim = s->dim / s->n_heads;
    cfg.vocab_size = s->vocab;
    cfg.max_seq_len = s->ctx;
    cfg.rope_theta = s->theta;
    cfg.rms_eps = s->eps;
    cfg.rope_layout = MODEL_ROPE_HALF;
    cfg.rope_scaling = MODEL_ROPE_SCALING_NONE;
    if (s->llama3_factor > 0.0f) {
        cfg.rope_scaling = MODEL_ROPE_SCALING_LLAMA3;
        cfg.rope_factor = s->llama3_factor;
        cfg.rope_low_freq_factor = 1.0f;
        cfg.rope_high_freq_factor = 4.0f;
        cfg.rope_orig_max_pos = 8192;
    }
    cfg.tied_embeddings = s->tied;
    cfg.qkv_bias = s->qkv_bias;
    cfg.bos_id = s->bos;
    cfg.n_eos = s->n_eos;
    for (int i = 0; i < s->n_eos; i++)
        cfg.eos_ids[i] = s->eos[i];
    *cfg_p = cfg;
    if (arch_p != NULL)
        *arch_p = s->arch;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// parallel fill

typedef struct {
    model_tensor_t *t;  /* view whose data lies in the arena */
    bool ones;          /* norm weight: fill with 1.0 */
    int64_t first_chunk; /* global index of its first chunk */
} synth_job_t;

typedef struct {
    synth_job_t *jobs;      /* (n_jobs) in arena order */
    int n_jobs;             /* entries in jobs */
    int64_t n_chunks;       /* chunks over all jobs */
    uint64_t seed;          /* user seed */
    atomic_llong next;      /* next chunk to take */
} synth_fill_t;

static uint64_t synth_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One roughly normal value (std SYNTH_STD) from a splitmix64 stream: the
 * sum of four 16-bit uniforms, mean 2*65535, variance 4*65536^2/12. */
static inline float synth_next(uint64_t *s)
{
    const float scale = SYNTH_STD * 1.7320508f / 65536.0f;
    uint64_t r;

    *s += 0x9e3779b97f4a7c15ull;
    r = *s;
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
    r ^= r >> 31;
    return ((float)((r & 0xffff) + ((r >> 16) & 0xffff) +
                    ((r >> 32) & 0xffff) + (r >> 48)) -
            2.0f * 65535.0f) * scale;
}

static void synth_fill_chunk(const synth_fill_t *f, const synth_job_t *job,
                             int job_idx, int64_t chunk)
{
    const model_tensor_t *t = job->t;
    int64_t numel = t->rows * t->cols;
    int64_t begin = chunk * SYNTH_CHUNK;
    int64_t end = BT_MIN(numel, begin + SYNTH_CHUNK);
    uint64_t s = synth_mix(f->seed ^ synth_mix((uint64_t)job_idx << 32 ^
                                               (uint64_t)chunk));
    float *f32 = (float *)t->data;
    uint16_t *u16 = (uint16_t *)t->data;

    /* one loop per dtype so each stays a tight, branch-free loop */
    switch (t->dtype) {
    case MODEL_DTYPE_F32:
        for (int64_t i = begin; i < end; i++)
            f32[i] = job->ones ? 1.0f : synth_next(&s);
        break;
    case MODEL_DTYPE_BF16:
        for (int64_t i = begin; i < end; i++)
            u16[i] = model_f32_to_bf16(job->ones ? 1.0f : synth_next(&s));
        break;
    case MODEL_DTYPE_F16:
        for (int64_t i = begin; i < end; i++)
            u16[i] = model_f32_to_f16(job->ones ? 1.0f : synth_next(&s));
        break;
    }
}

static void *synth_fill_thread(void *arg)
{
    synth_fill_t *f = arg;
    int job = 0;

    for (;;) {
        int64_t c = atomic_fetch_add(&f->next, 1);
        if (c >= f->n_chunks)
            break;
        /* chunks are taken in increasing order: advance the job cursor */
        while (job + 1 < f->n_jobs && f->jobs[job + 1].first_chunk <= c)
            job++;
        while (job > 0 && f->jobs[job].first_chunk > c)
            job--;
        synth_fill_chunk(f, &f->jobs[job], job, c - f->jobs[job].first_chunk);
    }
    return NULL;
}

static int synth_thread_count(int64_t n_chunks)
{
    const char *env = getenv("BT_SYNTH_THREADS");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int v;

    if (env != NULL && bt_parse_int(env, &v) == BT_OK && v > 0)
        n = v;
    if (n < 1)
        n = 1;
    if (n > SYNTH_MAX_THREADS)
        n = SYNTH_MAX_THREADS;
    if (n > n_chunks)
        n = (long)BT_MAX(n_chunks, 1);
    return (int)n;
}

static void synth_fill(synth_fill_t *f)
{
    pthread_t threads[SYNTH_MAX_THREADS];
    int n = synth_thread_count(f->n_chunks);
    int started = 0;

    atomic_init(&f->next, 0);
    for (int i = 1; i < n; i++) {
        if (pthread_create(&threads[started], NULL, synth_fill_thread, f) != 0)
            break; /* the calling thread finishes the work alone */
        started++;
    }
    synth_fill_thread(f);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
}

// ----------------------------------------------------------------------------
// building

/* Lays a tensor out in the arena at *off (64-byte aligned) and records its
 * job.  With arena == NULL only counts bytes. */
static void synth_place(model_tensor_t *t, int64_t rows, int64_t cols,
                        model_dtype_t dtype, bool ones, uint8_t *arena,
                        size_t *off, synth_job_t *jobs, int *n_jobs)
{
    size_t bytes = (size_t)(rows * cols) * model_dtype_size(dtype);

    t->dtype = dtype;
    t->rows = rows;
    t->cols = cols;
    t->data = arena != NULL ? arena + *off : NULL;
    if (jobs != NULL) {
        jobs[*n_jobs].t = t;
        jobs[*n_jobs].ones = ones;
    }
    (*n_jobs)++;
    *off += (bytes + 63) & ~(size_t)63;
}

/* Places every tensor of `m`; returns the arena size. */
static size_t synth_layout(model_t *m, model_dtype_t dt, uint8_t *arena,
                           synth_job_t *jobs, int *n_jobs)
{
    const model_config_t *c = &m->cfg;
    int64_t dim = c->dim, hid = c->hidden_dim;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    int64_t kvd = (int64_t)c->n_kv_heads * c->head_dim;
    size_t off = 0;

    *n_jobs = 0;
    synth_place(&m->tok_embedding, c->vocab_size, dim, dt, false, arena, &off,
                jobs, n_jobs);
    for (int l = 0; l < c->n_layers; l++) {
        model_layer_t *ly = &m->layers[l];
        synth_place(&ly->attn_norm, 1, dim, dt, true, arena, &off, jobs,
                    n_jobs);
        synth_place(&ly->wq, qd, dim, dt, false, arena, &off, jobs, n_jobs);
        synth_place(&ly->wk, kvd, dim, dt, false, arena, &off, jobs, n_jobs);
        synth_place(&ly->wv, kvd, dim, dt, false, arena, &off, jobs, n_jobs);
        if (c->qkv_bias) {
            synth_place(&ly->bq, 1, qd, dt, false, arena, &off, jobs, n_jobs);
            synth_place(&ly->bk, 1, kvd, dt, false, arena, &off, jobs, n_jobs);
            synth_place(&ly->bv, 1, kvd, dt, false, arena, &off, jobs, n_jobs);
        }
        synth_place(&ly->wo, dim, qd, dt, false, arena, &off, jobs, n_jobs);
        synth_place(&ly->ffn_norm, 1, dim, dt, true, arena, &off, jobs,
                    n_jobs);
        synth_place(&ly->w_gate, hid, dim, dt, false, arena, &off, jobs,
                    n_jobs);
        synth_place(&ly->w_down, dim, hid, dt, false, arena, &off, jobs,
                    n_jobs);
        synth_place(&ly->w_up, hid, dim, dt, false, arena, &off, jobs,
                    n_jobs);
    }
    synth_place(&m->final_norm, 1, dim, dt, true, arena, &off, jobs, n_jobs);
    if (!c->tied_embeddings)
        synth_place(&m->classifier, c->vocab_size, dim, dt, false, arena,
                    &off, jobs, n_jobs);
    return off;
}

static bt_status_t synth_build(const model_config_t *cfg, const char *arch,
                               uint64_t seed, model_dtype_t dtype, bool lazy,
                               model_t **model_p)
{
    synth_fill_t fill;
    model_t *m = NULL;
    size_t bytes;
    int n_jobs = 0;
    long pages, page_size;
    double t0 = bt_time_s();
    bt_status_t status;

    status = model_config_validate(cfg);
    if (status != BT_OK)
        return status;
    if (dtype != MODEL_DTYPE_F32 && dtype != MODEL_DTYPE_F16 &&
        dtype != MODEL_DTYPE_BF16)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "bad synth dtype %d",
                        (int)dtype);
    status = model__create(cfg->n_layers, &m);
    if (status != BT_OK)
        return status;
    m->cfg = *cfg;
    m->format = MODEL_FORMAT_SYNTH;
    m->synth_seed = seed;
    snprintf(m->arch, sizeof(m->arch), "%s", arch);

    bytes = synth_layout(m, dtype, NULL, NULL, &n_jobs);
    if (lazy) {
        /* views only: every data pointer stays NULL */
        m->synth_lazy = true;
        if (cfg->tied_embeddings)
            m->classifier = m->tok_embedding;
        BT_LOG_INFO("MODEL", "synth %s: %lld params, %.2f GiB %s, lazy "
                    "(generated where used)", arch,
                    (long long)model_param_count(m),
                    (double)bytes / (1 << 30), model_dtype_name(dtype));
        *model_p = m;
        return BT_OK;
    }
    pages = sysconf(_SC_PHYS_PAGES);
    page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0 &&
        (double)bytes > 0.9 * (double)pages * (double)page_size) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, "MODEL",
                          "synth %s weights need %.1f GiB, more than 90%% of "
                          "this machine's %.1f GiB RAM", arch,
                          (double)bytes / (1 << 30),
                          (double)pages * (double)page_size / (1 << 30));
        goto err_destroy;
    }
    m->arena = bt_malloc_aligned(bytes, "model_synth");
    fill.jobs = bt_malloc(sizeof(*fill.jobs) * (size_t)n_jobs, "synth_jobs");
    if (m->arena == NULL || fill.jobs == NULL) {
        bt_free(fill.jobs);
        status = BT_ERROR(BT_ERR_NO_MEMORY, "MODEL",
                          "cannot allocate %zu bytes of synth weights", bytes);
        goto err_destroy;
    }
    m->arena_bytes = bytes;
    if (bytes >= ((size_t)64 << 20)) { /* fewer page faults on the fill */
        uintptr_t a = ((uintptr_t)m->arena + (2u << 20) - 1) &
                      ~(uintptr_t)((2u << 20) - 1);
        if (a < (uintptr_t)m->arena + bytes)
            madvise((void *)a, (uintptr_t)m->arena + bytes - a,
                    MADV_HUGEPAGE);
    }
    synth_layout(m, dtype, m->arena, fill.jobs, &n_jobs);
    if (cfg->tied_embeddings)
        m->classifier = m->tok_embedding;

    fill.n_jobs = n_jobs;
    fill.seed = seed;
    fill.n_chunks = 0;
    for (int i = 0; i < n_jobs; i++) {
        fill.jobs[i].first_chunk = fill.n_chunks;
        fill.n_chunks += BT_DIV_UP(fill.jobs[i].t->rows * fill.jobs[i].t->cols,
                                   SYNTH_CHUNK);
    }
    synth_fill(&fill);
    bt_free(fill.jobs);
    BT_LOG_INFO("MODEL", "synth %s: %lld params, %.2f GiB %s in %.2f s",
                arch, (long long)model_param_count(m),
                (double)bytes / (1 << 30), model_dtype_name(dtype),
                bt_time_s() - t0);
    *model_p = m;
    return BT_OK;

err_destroy:
    model_destroy(&m);
    return status;
}

bt_status_t model_synth_from_cfg(const model_config_t *cfg, const char *arch,
                                 uint64_t seed, model_dtype_t dtype,
                                 model_t **model_p)
{
    return synth_build(cfg, arch, seed, dtype, false, model_p);
}

bt_status_t model_synth_from_cfg_lazy(const model_config_t *cfg,
                                      const char *arch, uint64_t seed,
                                      model_dtype_t dtype, model_t **model_p)
{
    return synth_build(cfg, arch, seed, dtype, true, model_p);
}

/* flags: MODEL_LOAD_SYNTH_LAZY*, see model.h (0: filled on the host). */
static bt_status_t synth_create(const char *shape, uint64_t seed, int dtype,
                                unsigned flags, model_t **model_p)
{
    const synth_shape_t *s;
    model_config_t cfg;
    const char *arch;
    bt_status_t status;

    status = model_synth_shape_config(shape, &cfg, &arch);
    if (status != BT_OK)
        return status;
    s = synth_find(shape);
    if (dtype == MODEL_SYNTH_DTYPE_DEFAULT)
        dtype = s->big ? MODEL_DTYPE_BF16 : MODEL_DTYPE_F32;
    if (flags & MODEL_LOAD_SYNTH_LAZY_LARGE) {
        /* the arena size of the shape, without building it */
        model_t *probe = NULL;
        int n_jobs = 0;
        bt_status_t st = model__create(cfg.n_layers, &probe);

        if (st != BT_OK)
            return st;
        probe->cfg = cfg;
        if (synth_layout(probe, (model_dtype_t)dtype, NULL, NULL, &n_jobs) >=
            ((size_t)1 << 30))
            flags |= MODEL_LOAD_SYNTH_LAZY;
        model_destroy(&probe);
    }
    return synth_build(&cfg, arch, seed, (model_dtype_t)dtype,
                       (flags & MODEL_LOAD_SYNTH_LAZY) != 0, model_p);
}

bt_status_t model_synth_create(const char *shape, uint64_t seed, int dtype,
                               model_t **model_p)
{
    return synth_create(shape, seed, dtype, 0, model_p);
}

bt_status_t model_synth_from_config(const char *config_path, uint64_t seed,
                                    int dtype, model_t **model_p)
{
    char dir[PATH_MAX], file[PATH_MAX + 64];
    char *text = NULL, *gen = NULL;
    size_t len = 0, gen_len = 0;
    model_config_t cfg;
    struct stat st;
    char arch[64];
    bt_status_t status;

    if (snprintf(dir, sizeof(dir), "%s", config_path) >= (int)sizeof(dir))
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL", "path too long");
    if (stat(dir, &st) != 0)
        return BT_ERROR(BT_ERR_IO, "MODEL", "%s does not exist", config_path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof(file), "%s/config.json", dir);
    } else {
        char *slash = strrchr(dir, '/');
        snprintf(file, sizeof(file), "%s", config_path);
        if (slash == NULL)
            snprintf(dir, sizeof(dir), ".");
        else
            *slash = '\0';
    }
    status = bt_read_file(file, 64u << 20, &text, &len);
    if (status != BT_OK)
        return status;
    snprintf(file, sizeof(file), "%s/generation_config.json", dir);
    if (access(file, F_OK) == 0) {
        status = bt_read_file(file, 64u << 20, &gen, &gen_len);
        if (status != BT_OK)
            goto out;
    }
    status = model_hf_config_parse(text, len, gen, gen_len, &cfg, arch,
                                   sizeof(arch));
    if (status != BT_OK)
        goto out;
    if (dtype == MODEL_SYNTH_DTYPE_DEFAULT) {
        int64_t approx = (int64_t)cfg.n_layers * cfg.dim *
                             (4 * (int64_t)cfg.dim + 3 * cfg.hidden_dim) +
                         2 * (int64_t)cfg.vocab_size * cfg.dim;
        dtype = approx > 100 * 1000 * 1000 ? MODEL_DTYPE_BF16
                                           : MODEL_DTYPE_F32;
    }
    status = model_synth_from_cfg(&cfg, arch, seed, (model_dtype_t)dtype,
                                  model_p);
out:
    bt_free(gen);
    bt_free(text);
    return status;
}

/* "synth:NAME" or "synth:NAME:SEED" (seed 0 by default). */
bt_status_t model__load_synth(const char *spec, unsigned flags,
                              model_t **model_p)
{
    char name[64];
    const char *rest = spec + strlen("synth:");
    const char *colon = strchr(rest, ':');
    uint64_t seed = 0;
    size_t n = colon != NULL ? (size_t)(colon - rest) : strlen(rest);

    if (n == 0 || n >= sizeof(name))
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL",
                        "bad synth spec \"%.100s\" (synth:NAME[:SEED])", spec);
    memcpy(name, rest, n);
    name[n] = '\0';
    if (colon != NULL && bt_parse_u64(colon + 1, &seed) != BT_OK)
        return BT_ERROR(BT_ERR_INVALID_ARG, "MODEL",
                        "bad synth seed in \"%.100s\" (synth:NAME[:SEED])",
                        spec);
    return synth_create(name, seed, MODEL_SYNTH_DTYPE_DEFAULT, flags,
                        model_p);
}

// ----------------------------------------------------------------------------
// the generator element by element (model_synth.h)

_Static_assert(SYNTH_CHUNK == MODEL_SYNTH_CHUNK, "chunk size is the contract");

float model_synth_value(uint64_t seed, int id, int64_t index)
{
    int64_t chunk = index / SYNTH_CHUNK, o = index % SYNTH_CHUNK;
    uint64_t s = synth_mix(seed ^ synth_mix((uint64_t)id << 32 ^
                                            (uint64_t)chunk));

    s += (uint64_t)o * MODEL_SYNTH_GOLDEN; /* synth_next adds the last one */
    return synth_next(&s);
}

bool model_synth_tensor(const model_t *model, const model_tensor_t *t,
                        model_synth_src_t *src_p)
{
    const model_config_t *c = &model->cfg;
    int per = 9 + (c->qkv_bias ? 3 : 0); /* tensors per layer */
    const model_layer_t *ly0 = model->layers;
    model_synth_src_t src = { model->synth_seed, -1, false };

    if (model->format != MODEL_FORMAT_SYNTH || t == NULL)
        return false;
    if (t == &model->tok_embedding ||
        (t == &model->classifier && c->tied_embeddings)) {
        src.id = 0;
    } else if (t == &model->final_norm) {
        src.id = 1 + c->n_layers * per;
        src.ones = true;
    } else if (t == &model->classifier) {
        src.id = 2 + c->n_layers * per;
    } else if ((const char *)t >= (const char *)ly0 &&
               (const char *)t < (const char *)(ly0 + c->n_layers)) {
        int l = (int)(((const char *)t - (const char *)ly0) /
                      (ptrdiff_t)sizeof(*ly0));
        const model_layer_t *ly = &ly0[l];
        const model_tensor_t *order[12];
        int n = 0;

        order[n++] = &ly->attn_norm;
        order[n++] = &ly->wq;
        order[n++] = &ly->wk;
        order[n++] = &ly->wv;
        if (c->qkv_bias) {
            order[n++] = &ly->bq;
            order[n++] = &ly->bk;
            order[n++] = &ly->bv;
        }
        order[n++] = &ly->wo;
        order[n++] = &ly->ffn_norm;
        order[n++] = &ly->w_gate;
        order[n++] = &ly->w_down;
        order[n++] = &ly->w_up;
        for (int i = 0; i < n; i++) {
            if (order[i] == t) {
                src.id = 1 + l * per + i;
                src.ones = t == &ly->attn_norm || t == &ly->ffn_norm;
            }
        }
    }
    if (src.id < 0)
        return false;
    *src_p = src;
    return true;
}

void model_synth_to_f32(const model_synth_src_t *src, model_dtype_t dtype,
                        int64_t offset, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        float v = src->ones ? 1.0f
                            : model_synth_value(src->seed, src->id,
                                                offset + i);
        if (dtype == MODEL_DTYPE_BF16)
            v = model_bf16_to_f32(model_f32_to_bf16(v));
        else if (dtype == MODEL_DTYPE_F16)
            v = model_f16_to_f32(model_f32_to_f16(v));
        out[i] = v;
    }
}
