/*
 * test_rope_kv.cu - cuda_rope_kv() against rope_kv_ref(): both RoPE
 * layouts, no/LINEAR/LLAMA3 scaling, with and without q/k/v bias, KV
 * block sizes 8/16/64 with shuffled block ids, tokens that write no slot,
 * f32 and bf16.  q and both caches are poisoned first; written slots are
 * compared, unwritten slots must still hold the poison.
 * Run: build-cuda/gpu/test_rope_kv   (make gpu-test)
 */
#include "cuda_backend.h"
#include "kernels/rope_kv.h"
#include "kernels_ref.h"
#include "kt_common.h"

typedef struct {
    int nh, nkv, hd, half, scaling, bias, bs, n_tok;
} rope_case_t;

static void run_case(const rope_case_t *c, cuda_dtype_t dt)
{
    model_config_t mc;
    int n_blocks = 40, n_slots = n_blocks * c->bs;
    int qkv_dim = (c->nh + 2 * c->nkv) * c->hd;
    size_t cache_n = (size_t)n_slots * c->nkv * c->hd;
    float *inv = (float *)malloc(sizeof(float) * c->hd / 2);
    int *pos = (int *)malloc(sizeof(int) * c->n_tok);
    int *slot = (int *)malloc(sizeof(int) * c->n_tok);
    char *used = (char *)calloc(n_slots, 1);

    memset(&mc, 0, sizeof(mc));
    mc.head_dim = c->hd;
    mc.rope_theta = c->scaling == 2 ? 500000.0f : 10000.0f;
    mc.rope_scaling = (model_rope_scaling_t)c->scaling;
    mc.rope_factor = c->scaling == 1 ? 2.0f : 8.0f;
    mc.rope_low_freq_factor = 1.0f;
    mc.rope_high_freq_factor = 4.0f;
    mc.rope_orig_max_pos = 8192;
    cuda__rope_inv_freq(&mc, inv);

    for (int t = 0; t < c->n_tok; t++) {
        pos[t] = t == 0 ? 0 : (int)(kt_u32() % 131072);
        do
            slot[t] = (int)(kt_u32() % n_slots);
        while (used[slot[t]]);
        used[slot[t]] = 1;
        if (t % 5 == 4) { /* no KV write (graph padding) */
            used[slot[t]] = 0;
            slot[t] = -1;
        }
    }
    float *qkv = kt_rand_vec((size_t)c->n_tok * qkv_dim, -2, 2, dt);
    float *bias = kt_rand_vec(qkv_dim, -0.5f, 0.5f, dt);
    float *q_ref = (float *)malloc(sizeof(float) * c->n_tok * c->nh * c->hd);
    float *k_ref = (float *)malloc(sizeof(float) * cache_n);
    float *v_ref = (float *)malloc(sizeof(float) * cache_n);
    for (size_t i = 0; i < cache_n; i++)
        k_ref[i] = v_ref[i] = NAN;
    rope_kv_ref(qkv, c->bias ? bias : NULL, inv, pos, slot, c->n_tok, c->nh,
                c->nkv, c->hd, c->half, q_ref, k_ref, v_ref);

    cuda_rope_kv_args_t a;
    memset(&a, 0, sizeof(a));
    a.n_tokens = c->n_tok;
    a.n_heads = c->nh;
    a.n_kv_heads = c->nkv;
    a.head_dim = c->hd;
    a.rope_half = c->half;
    a.d_qkv = kt_upload(qkv, (size_t)c->n_tok * qkv_dim, dt);
    a.d_bias = c->bias ? kt_upload(bias, qkv_dim, dt) : NULL;
    a.d_inv_freq = (const float *)kt_upload(inv, c->hd / 2, CUDA_DT_F32);
    a.d_pos = (const int *)kt_upload_raw(pos, sizeof(int) * c->n_tok);
    a.d_slot = (const int *)kt_upload_raw(slot, sizeof(int) * c->n_tok);
    a.d_q = kt_poisoned((size_t)c->n_tok * c->nh * c->hd, dt);
    a.d_k_cache = kt_poisoned(cache_n, dt);
    a.d_v_cache = kt_poisoned(cache_n, dt);
    KT_OK(cuda_rope_kv(&a, dt, 0));
    float *q = kt_download(a.d_q, (size_t)c->n_tok * c->nh * c->hd, dt);
    float *k = kt_download(a.d_k_cache, cache_n, dt);
    float *v = kt_download(a.d_v_cache, cache_n, dt);

    /* Written slots compared; the rest must still be NaN. */
    size_t row = (size_t)c->nkv * c->hd, n_w = 0, stray = 0;
    float *kw = (float *)malloc(sizeof(float) * cache_n);
    float *kr = (float *)malloc(sizeof(float) * cache_n);
    float *vw = (float *)malloc(sizeof(float) * cache_n);
    float *vr = (float *)malloc(sizeof(float) * cache_n);
    for (int s = 0; s < n_slots; s++) {
        for (size_t e = 0; e < row; e++) {
            size_t i = (size_t)s * row + e;
            if (used[s]) {
                kw[n_w] = k[i], kr[n_w] = k_ref[i];
                vw[n_w] = v[i], vr[n_w] = v_ref[i];
                n_w++;
            } else if (!isnan(k[i]) || !isnan(v[i])) {
                stray++;
            }
        }
    }
    char what[128];
    double tol = dt == CUDA_DT_F32 ? 2e-6 : 4e-3;
    snprintf(what, sizeof(what), "rope q %s nh=%d nkv=%d hd=%d %s sc=%d%s "
             "bs=%d n=%d", kt_dt_name(dt), c->nh, c->nkv, c->hd,
             c->half ? "half" : "adj", c->scaling, c->bias ? " bias" : "",
             c->bs, c->n_tok);
    kt_compare(what, q, q_ref, (size_t)c->n_tok * c->nh * c->hd, tol);
    what[5] = 'k';
    kt_compare(what, kw, kr, n_w, tol);
    what[5] = 'v';
    kt_compare(what, vw, vr, n_w, tol);
    if (stray) {
        printf("FAIL rope: %zu cache elements written outside the slots\n",
               stray);
        kt_failures++;
    }
    cudaFree((void *)a.d_qkv);
    cudaFree((void *)a.d_bias);
    cudaFree((void *)a.d_inv_freq);
    cudaFree((void *)a.d_pos);
    cudaFree((void *)a.d_slot);
    cudaFree(a.d_q);
    cudaFree(a.d_k_cache);
    cudaFree(a.d_v_cache);
    free(inv); free(pos); free(slot); free(used); free(qkv); free(bias);
    free(q_ref); free(k_ref); free(v_ref); free(q); free(k); free(v);
    free(kw); free(kr); free(vw); free(vr);
}

int main(void)
{
    const rope_case_t cases[] = {
        {4, 4, 16, 0, 0, 0, 8, 13},   /* aidreams260K */
        {8, 4, 8, 0, 0, 0, 16, 7},    /* stories260K */
        {8, 4, 8, 1, 0, 0, 64, 9},
        {32, 8, 128, 1, 2, 0, 16, 37}, /* Llama 3.1 */
        {12, 2, 64, 1, 1, 1, 8, 11},  /* linear scaling + Qwen bias */
        {28, 4, 128, 0, 2, 1, 64, 5},
        {32, 8, 128, 1, 2, 0, 16, 300}, /* Llama 3, a prefill chunk */
        {16, 2, 64, 0, 0, 1, 8, 19},
    };
    kt_seed(5);
    /* the vector kernel where head sizes allow, else the scalar one */
    for (int dti = 0; dti < 2; dti++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            run_case(&cases[i], dti ? CUDA_DT_BF16 : CUDA_DT_F32);
    return kt_finish("test_rope_kv");
}
