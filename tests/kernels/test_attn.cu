/*
 * test_attn.cu - the paged attention kernels against attn_ref():
 *   - cuda_attn_decode (per-token, split-K) with one split and with many;
 *     bf16 at head size 64/128 takes the tensor-core kernel
 *     (attn_decode_tc.cu), so those runs repeat once with BT_ATTN_TC=0 to
 *     keep the general kernel tested; and with RoPE and the new keys'
 *     K/V write fused into it (single-token steps, run_rope_case; at
 *     1-2 tokens the new-row instance),
 *   - cuda_attn_prefill (tiled, tensor cores, bf16) for chunks >= 16
 *     tokens, the rest through cuda_attn_decode, as the backend mixes them;
 *     at head 64/128 also each kernel of attn_prefill_fa2.cu that the
 *     default falls back to, called directly (cuda_attn_prefill_fa2: fa2
 *     on mma.sync with the warp count it picks and with 4 and 8 warps,
 *     fa2wqv = the default at head 64, fa2pp, fa2pp128 = the default at
 *     head 128),
 *   - the prefill tiles over an FP8 (E4M3) KV cache with per-KV-head
 *     scales (run_kv8_case: "attn prefill kv8 (<variant>)" lines, the
 *     default and each FA2 variant at head 64/128),
 *   - the decode kernels over an FP8 KV cache at serving shapes
 *     (run_kv8_decode_stress: "attn decode kv8 stress" lines; hundreds
 *     of rows, kv lengths 0 .. 2200, 1 .. 64 splits, a 100K-block pool;
 *     `--kv8-stress` runs only those, with more seeds),
 * over mixed batches: decode tokens at several context lengths, a fresh
 * prompt, a chunk after a cached prefix, a masked draft tree; GQA groups
 * 1, 2, 4, 7 and 16; head sizes 8..256; KV block sizes 8/16/64 with
 * shuffled block ids (a third of the batches in order); f32 and bf16.
 * Output poisoned before each run.
 * Run: build-cuda/gpu/test_attn [--bench | --kv8-stress [rows [pool
 * [reps]]]]   (make gpu-test; gpu-bench
 * runs --bench: KV read bandwidth of decode, TFLOP/s of prefill)
 */
#include <vector>

#include "bt_fp8.h"
#include "kernels/attn_decode.h"
#include "kernels/attn_prefill.h"
#include "kernels/kv_copy.h"
#include "kernels_ref.h"
#include "kt_common.h"

typedef struct {
    int ctx, n, masked;
} seq_t;

typedef struct {
    int nh, nkv, hd, bs;
    std::vector<seq_t> seqs;
} attn_case_t;

/* Host + device description of one batch. */
typedef struct {
    int nt, n_blocks;
    std::vector<int> kv_len, bt_off, ctx, mask_off, bt, tiles, gen, all;
    std::vector<uint8_t> masks;
    float *q, *k, *v;
    cuda_attn_args_t a;
    int *d_tiles, *d_gen, *d_all;
} batch_t;

/* a's shape and per-token metadata (block tables, mask bytes, kv
 * lengths, table offsets, context lengths, mask offsets of nt tokens)
 * uploaded; q, the caches and the output are the caller's. */
static void args_upload_meta(cuda_attn_args_t *a, int nh, int nkv, int hd,
                             int bs, long long kv_slots,
                             const std::vector<int> &bt,
                             const uint8_t *masks, size_t n_masks,
                             const int *kv_len, const int *bt_off,
                             const int *ctx, const int *mask_off, int nt)
{
    memset(a, 0, sizeof(*a));
    a->n_heads = nh;
    a->n_kv_heads = nkv;
    a->head_dim = hd;
    a->block_size = bs;
    a->scale = 1.0f / sqrtf((float)hd);
    a->kv_slots = kv_slots;
    a->d_block_tables = (const int *)kt_upload_raw(bt.data(),
                                                   sizeof(int) * bt.size());
    a->d_masks = (const uint8_t *)kt_upload_raw(masks, n_masks);
    a->d_kv_len = (const int *)kt_upload_raw(kv_len, sizeof(int) * nt);
    a->d_bt_off = (const int *)kt_upload_raw(bt_off, sizeof(int) * nt);
    a->d_ctx_len = (const int *)kt_upload_raw(ctx, sizeof(int) * nt);
    a->d_mask_off = (const int *)kt_upload_raw(mask_off, sizeof(int) * nt);
}

static void batch_build(const attn_case_t *c, cuda_dtype_t dt, batch_t *b)
{
    int used_blocks = 0;
    b->nt = 0;
    for (const seq_t &s : c->seqs) {
        b->nt += s.n;
        used_blocks += (s.ctx + s.n + c->bs - 1) / c->bs;
    }
    b->n_blocks = used_blocks + 7;
    std::vector<int> perm(b->n_blocks);
    for (int i = 0; i < b->n_blocks; i++)
        perm[i] = i;
    /* A third of the batches keep their blocks in order, as a fresh pool
     * hands them out: the ping-pong prefill kernels copy such runs as
     * whole tiles, the rest page by page. */
    if (kt_u32() % 3 != 0)
        for (int i = b->n_blocks - 1; i > 0; i--) {
            int j = (int)(kt_u32() % (i + 1));
            int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
    int next = 0, tok = 0;
    for (const seq_t &s : c->seqs) {
        int nb = (s.ctx + s.n + c->bs - 1) / c->bs;
        int bt_off = (int)b->bt.size();
        int moff = -1;
        for (int i = 0; i < nb; i++)
            b->bt.push_back(perm[next++]);
        if (s.masked) {
            moff = (int)b->masks.size();
            for (int i = 0; i < s.n; i++)
                for (int j = 0; j < s.n; j++)
                    b->masks.push_back(j == i || (j < i && (kt_u32() & 1)));
        }
        if (s.n >= 16)
            for (int i0 = 0; i0 < s.n; i0 += CUDA_PREFILL_BQ) {
                int t[CUDA_PREFILL_TILE_INTS] = {0};
                t[CUDA_PT_TOK0] = tok;
                t[CUDA_PT_I0] = i0;
                t[CUDA_PT_NQ] = s.n - i0 < CUDA_PREFILL_BQ ? s.n - i0
                                                           : CUDA_PREFILL_BQ;
                t[CUDA_PT_NTOK] = s.n;
                t[CUDA_PT_CTX] = s.ctx;
                t[CUDA_PT_BT_OFF] = bt_off;
                t[CUDA_PT_MASK_OFF] = moff;
                b->tiles.insert(b->tiles.end(), t, t + CUDA_PREFILL_TILE_INTS);
            }
        for (int i = 0; i < s.n; i++, tok++) {
            b->kv_len.push_back(s.masked ? s.ctx + s.n : s.ctx + i + 1);
            b->bt_off.push_back(bt_off);
            b->ctx.push_back(s.ctx);
            b->mask_off.push_back(s.masked ? moff + i * s.n : -1);
            b->all.push_back(tok);
            if (s.n < 16)
                b->gen.push_back(tok);
        }
    }
    if (b->masks.empty())
        b->masks.push_back(0);
    size_t cache_n = (size_t)b->n_blocks * c->bs * c->nkv * c->hd;
    b->q = kt_rand_vec((size_t)b->nt * c->nh * c->hd, -1, 1, dt);
    b->k = kt_rand_vec(cache_n, -1, 1, dt);
    b->v = kt_rand_vec(cache_n, -1, 1, dt);

    cuda_attn_args_t *a = &b->a;
    args_upload_meta(a, c->nh, c->nkv, c->hd, c->bs,
                     (long long)b->n_blocks * c->bs, b->bt, b->masks.data(),
                     b->masks.size(), b->kv_len.data(), b->bt_off.data(),
                     b->ctx.data(), b->mask_off.data(), b->nt);
    a->d_q = kt_upload(b->q, (size_t)b->nt * c->nh * c->hd, dt);
    a->d_k_cache = kt_upload(b->k, cache_n, dt);
    a->d_v_cache = kt_upload(b->v, cache_n, dt);
    a->d_out = kt_poisoned((size_t)b->nt * c->nh * c->hd, dt);
    b->d_tiles = (int *)kt_upload_raw(b->tiles.data(),
                                      sizeof(int) * b->tiles.size());
    b->d_gen = (int *)kt_upload_raw(b->gen.data(), sizeof(int) * b->gen.size());
    b->d_all = (int *)kt_upload_raw(b->all.data(), sizeof(int) * b->nt);
}

static void batch_free(batch_t *b)
{
    cuda_attn_args_t *a = &b->a;
    cudaFree((void *)a->d_q);
    cudaFree((void *)a->d_k_cache);
    cudaFree((void *)a->d_v_cache);
    cudaFree((void *)a->d_block_tables);
    cudaFree((void *)a->d_masks);
    cudaFree((void *)a->d_kv_len);
    cudaFree((void *)a->d_bt_off);
    cudaFree((void *)a->d_ctx_len);
    cudaFree((void *)a->d_mask_off);
    cudaFree(a->d_out);
    cudaFree(b->d_tiles);
    cudaFree(b->d_gen);
    cudaFree(b->d_all);
    free(b->q); free(b->k); free(b->v);
}

static void run_case(const attn_case_t *c, cuda_dtype_t dt)
{
    batch_t b;
    batch_build(c, dt, &b);
    size_t n_out = (size_t)b.nt * c->nh * c->hd;
    float *ref = (float *)malloc(sizeof(float) * n_out);
    attn_ref(c->nh, c->nkv, c->hd, c->bs, b.a.scale, b.q, b.k, b.v,
             b.bt.data(), b.masks.data(), b.kv_len.data(), b.bt_off.data(),
             b.ctx.data(), b.mask_off.data(), b.nt, ref);
    int max_kv = 1;
    for (int t = 0; t < b.nt; t++)
        max_kv = b.kv_len[t] > max_kv ? b.kv_len[t] : max_kv;
    char what[160], desc[96];
    int pos = snprintf(desc, sizeof(desc), "%s h=%d/%d hd=%d bs=%d seqs",
                       kt_dt_name(dt), c->nh, c->nkv, c->hd, c->bs);
    for (const seq_t &s : c->seqs)
        if (pos < (int)sizeof(desc) - 16)
            pos += snprintf(desc + pos, sizeof(desc) - pos, " %d+%d%s",
                            s.ctx, s.n, s.masked ? "m" : "");
    double tol = kt_tol(dt);
    float *d_ws = NULL;

    /* 1. Every token through the per-token kernel, one split; again
     * through the general kernel when the tensor-core one took it. */
    bool tc = cuda_attn_decode_tc_ok(&b.a, dt);
    float *out;
    for (int pass = 0; pass < (tc ? 2 : 1); pass++) {
        if (pass)
            kt_switch("BT_ATTN_TC", "0");
        kt_poison(b.a.d_out, n_out, dt);
        KT_OK(cuda_attn_decode(&b.a, b.d_all, b.nt, 1, 1 << 30, NULL, dt, 0));
        out = kt_download(b.a.d_out, n_out, dt);
        snprintf(what, sizeof(what), "attn decode 1-split%s %s",
                 tc && !pass ? " (tensor cores)" : "", desc);
        kt_compare(what, out, ref, n_out, tol);
        free(out);
        if (pass) {
            /* general kernel with splits too */
            int ns = (max_kv + 63) / 64;
            KT_CUDA(cudaMalloc(&d_ws, 4 * cuda_attn_decode_ws_floats(
                                              b.nt, c->nh, c->hd, ns) + 4));
            kt_poison(b.a.d_out, n_out, dt);
            KT_OK(cuda_attn_decode(&b.a, NULL, b.nt, ns, 64, d_ws, dt, 0));
            out = kt_download(b.a.d_out, n_out, dt);
            snprintf(what, sizeof(what), "attn decode %dx64 (general) %s",
                     ns, desc);
            kt_compare(what, out, ref, n_out, tol);
            free(out);
            cudaFree(d_ws);
            kt_switch("BT_ATTN_TC", NULL);
        }
    }

    /* 2. Split-K: the planner's choice, then a forced 64-key split. */
    for (int pi = 0; pi < 2; pi++) {
        int ns, sl;
        cuda_attn_decode_plan(b.nt, max_kv, c->nh, c->nkv, 132, 2, 64, &ns,
                              &sl);
        if (pi == 1) {
            sl = 64;
            ns = (max_kv + 63) / 64;
        }
        KT_CUDA(cudaMalloc(&d_ws, 4 * cuda_attn_decode_ws_floats(
                                          b.nt, c->nh, c->hd, ns) + 4));
        kt_poison(b.a.d_out, n_out, dt);
        KT_OK(cuda_attn_decode(&b.a, NULL, b.nt, ns, sl, d_ws, dt, 0));
        out = kt_download(b.a.d_out, n_out, dt);
        snprintf(what, sizeof(what), "attn decode %dx%d %s", ns, sl, desc);
        kt_compare(what, out, ref, n_out, tol);
        free(out);
        cudaFree(d_ws);
    }

    /* 3. The backend's mix: tiles for chunks >= 16, per-token for rest. */
    /* (pass 0: the default; head 64/128 then attn_prefill_fa2.cu's
     * kernels the default falls back to, called directly: on mma.sync
     * (no sm_90a wgmma) with the warp count it picks (fa2) and with 4
     * and 8 warps, with S and P V on wgmma (fa2wqv), with the two
     * warpgroups in ping-pong fed by a TMA producer warp (fa2pp), and
     * that on 128-key tiles (fa2pp128)) */
    static const struct {
        const char *name;
        int warps; /* cuda_attn_prefill_fa2's n_warps */
        int wgmma; /* ... and wgmma */
    } pkinds[] = {{"default", 0, -1}, {"fa2", 0, 0},     {"fa2w4", 4, 0},
                  {"fa2w8", 8, 0},    {"fa2wqv", 0, 2},  {"fa2pp", 0, 3},
                  {"fa2pp128", 0, 4}};
    const bool two = cuda_attn_prefill_fa2_ok(c->hd, dt, false);
    /* KT_ATTN_FA2=0: without the fa2 passes (round 5 re-ran
     * the test so after a crash in them) */
    const char *f2env = getenv("KT_ATTN_FA2");
    const int n_pass = !two ? 1 : f2env && strcmp(f2env, "0") == 0 ? 1 : 7;
    for (int pass = 0; pass < n_pass &&
                       cuda_attn_prefill_ok(c->hd, dt) && !b.tiles.empty();
         pass++) {
        const int n_tiles = (int)b.tiles.size() / CUDA_PREFILL_TILE_INTS;
        kt_poison(b.a.d_out, n_out, dt);
        if (pkinds[pass].wgmma < 0)
            KT_OK(cuda_attn_prefill(&b.a, b.d_tiles, n_tiles, dt, 0));
        else
            KT_CUDA(cuda_attn_prefill_fa2(&b.a, b.d_tiles, n_tiles,
                                          pkinds[pass].warps,
                                          pkinds[pass].wgmma, 0));
        KT_OK(cuda_attn_decode(&b.a, b.d_gen, (int)b.gen.size(), 1, 1 << 30,
                               NULL, dt, 0));
        out = kt_download(b.a.d_out, n_out, dt);
        char pn[16] = "";
        if (two)
            snprintf(pn, sizeof(pn), " (%s)", pkinds[pass].name);
        snprintf(what, sizeof(what), "attn prefill%s+decode %s", pn, desc);
        kt_compare(what, out, ref, n_out, tol);
        free(out);
    }
    free(ref);
    batch_free(&b);
}

/* Turns batch b (built bf16 for case c) into an FP8 KV one: K (times 3)
 * and V quantized to E4M3 codes at a random scale per KV head and
 * direction (1 to 3 times amax / 448), the device caches replaced by the
 * codes, b->k and b->v by what the codes mean (code x scale), and
 * b->a.d_kv_scale set.  Returns the device scales (the caller frees). */
static float *batch_make_kv8(const attn_case_t *c, batch_t *b)
{
    const size_t cache_n = (size_t)b->n_blocks * c->bs * c->nkv * c->hd;
    std::vector<float> scale(2 * c->nkv);
    for (int h = 0; h < c->nkv; h++) {
        scale[h] = 3.0f / 448.0f * kt_uniform(1.0f, 3.0f);
        scale[c->nkv + h] = 1.0f / 448.0f * kt_uniform(1.0f, 3.0f);
    }
    std::vector<uint8_t> kc(cache_n), vc(cache_n);
    for (size_t i = 0; i < cache_n; i++) {
        const int kvh = (int)((i / c->hd) % c->nkv);
        const float ks = scale[kvh], vs = scale[c->nkv + kvh];
        kc[i] = bt_f32_to_e4m3(3.0f * b->k[i] / ks);
        vc[i] = bt_f32_to_e4m3(b->v[i] / vs);
        b->k[i] = bt_e4m3_to_f32(kc[i]) * ks; /* what the codes mean */
        b->v[i] = bt_e4m3_to_f32(vc[i]) * vs;
    }
    cudaFree((void *)b->a.d_k_cache);
    cudaFree((void *)b->a.d_v_cache);
    b->a.d_k_cache = kt_upload_raw(kc.data(), cache_n);
    b->a.d_v_cache = kt_upload_raw(vc.data(), cache_n);
    float *d_scale = (float *)kt_upload_raw(scale.data(),
                                            sizeof(float) * scale.size());
    b->a.d_kv_scale = d_scale;
    return d_scale;
}

/* FP8 KV (cuda_attn_args_t.d_kv_scale): the prefill tiles of case c over
 * a cache of E4M3 codes with a K and a V scale per KV head, against
 * attn_ref on the dequantized values (code x scale, what the cache
 * means), through cuda_attn_prefill (pass "default": the FA2 kernels at
 * head 64/128, the shared-memory one elsewhere) and, at head 64/128,
 * each FA2 variant called directly: fa2 (mma.sync) with the warp count
 * it picks and with 4 and 8 warps, fa2wqv the same, and wgmma 3 / 4,
 * which with FP8 KV fall back to fa2wqv; then the codes widened to bf16
 * (cuda_kv8_widen_pages, every block as its own page) and read by the
 * bf16 kernels with the scales (kv_widened: "widened" through
 * cuda_attn_prefill, "widened fa2pp128" / "widened fa2pp" directly,
 * which run the TMA ping-pong where it applies).  K values span +-3 (peakier
 * softmax than +-1, so a K scale applied wrong moves the weights) and
 * the scales differ by up to 3x between heads (a wrong head's scale
 * shows).  Only the tiles' tokens are compared (the others stay
 * poisoned); tolerance: the bf16 kernels' (relative L2 1e-2, as
 * tests/gpu/test_cuda_kv8.c's FP8-KV prefill).  One line per case and
 * variant: PASS/FAIL, rel_err and the largest absolute error. */
static void run_kv8_case(const attn_case_t *c)
{
    const cuda_dtype_t dt = CUDA_DT_BF16;
    batch_t b;
    batch_build(c, dt, &b);
    if (b.tiles.empty()) {
        batch_free(&b);
        return;
    }
    const size_t n_out = (size_t)b.nt * c->nh * c->hd;
    const size_t row = (size_t)c->nh * c->hd;
    float *d_scale = batch_make_kv8(c, &b);

    float *ref = (float *)malloc(sizeof(float) * n_out);
    attn_ref(c->nh, c->nkv, c->hd, c->bs, b.a.scale, b.q, b.k, b.v,
             b.bt.data(), b.masks.data(), b.kv_len.data(), b.bt_off.data(),
             b.ctx.data(), b.mask_off.data(), b.nt, ref);
    /* the rows of the tiles' tokens (sequences of >= 16 new tokens) */
    std::vector<int> rows;
    {
        int tok = 0;
        for (const seq_t &s : c->seqs)
            for (int i = 0; i < s.n; i++, tok++)
                if (s.n >= 16)
                    rows.push_back(tok);
    }
    const size_t n_cmp = rows.size() * row;
    float *ref_c = (float *)malloc(sizeof(float) * n_cmp);
    float *out_c = (float *)malloc(sizeof(float) * n_cmp);
    for (size_t r = 0; r < rows.size(); r++)
        memcpy(ref_c + r * row, ref + (size_t)rows[r] * row,
               sizeof(float) * row);

    char desc[96], what[200];
    int pos = snprintf(desc, sizeof(desc), "h=%d/%d hd=%d bs=%d seqs",
                       c->nh, c->nkv, c->hd, c->bs);
    for (const seq_t &s : c->seqs)
        if (pos < (int)sizeof(desc) - 16)
            pos += snprintf(desc + pos, sizeof(desc) - pos, " %d+%d%s",
                            s.ctx, s.n, s.masked ? "m" : "");
    static const struct {
        const char *name;
        int warps; /* cuda_attn_prefill_fa2's n_warps */
        int wgmma; /* ... and wgmma (-1: cuda_attn_prefill) */
    } kinds[] = {{"default", 0, -1},     {"fa2", 0, 0},
                 {"fa2w4", 4, 0},        {"fa2w8", 8, 0},
                 {"fa2wqv", 0, 2},       {"fa2wqv-w4", 4, 2},
                 {"fa2wqv-w8", 8, 2},    {"fa2pp>fa2wqv", 0, 3},
                 {"fa2pp128>fa2wqv", 0, 4}};
    const bool fa2 = cuda_attn_prefill_fa2_ok(c->hd, dt, true);
    const int n_kinds = fa2 ? (int)(sizeof(kinds) / sizeof(kinds[0])) : 1;
    const int n_tiles = (int)b.tiles.size() / CUDA_PREFILL_TILE_INTS;
    /* the widened caches: block i as page i (the block tables as they
     * are) */
    const size_t blk = (size_t)c->bs * c->nkv * c->hd;
    cuda_attn_args_t wa = b.a;
    void *d_wk = NULL, *d_wv = NULL;
    int *d_pages = NULL;
    if (fa2) {
        std::vector<int> pages(b.n_blocks);
        for (int i = 0; i < b.n_blocks; i++)
            pages[i] = i;
        d_pages = (int *)kt_upload_raw(pages.data(),
                                       sizeof(int) * pages.size());
        KT_CUDA(cudaMalloc(&d_wk, blk * b.n_blocks * 2));
        KT_CUDA(cudaMalloc(&d_wv, blk * b.n_blocks * 2));
        KT_OK(cuda_kv8_widen_pages(b.a.d_k_cache, b.a.d_v_cache, blk,
                                   d_pages, b.n_blocks, d_wk, d_wv, 0));
        wa.d_k_cache = d_wk;
        wa.d_v_cache = d_wv;
        wa.kv_widened = true;
    }
    static const struct {
        const char *name;
        int wgmma; /* -1: cuda_attn_prefill */
    } wkinds[] = {{"widened", -1}, {"widened fa2pp128", 4},
                  {"widened fa2pp", 3}};
    const int n_all = n_kinds + (fa2 ? 3 : 0);
    for (int k = 0; k < n_all; k++) {
        const bool wide = k >= n_kinds;
        const int wg = wide ? wkinds[k - n_kinds].wgmma : kinds[k].wgmma;
        const cuda_attn_args_t *a = wide ? &wa : &b.a;
        kt_poison(b.a.d_out, n_out, dt);
        if (wg < 0)
            KT_OK(cuda_attn_prefill(a, b.d_tiles, n_tiles, dt, 0));
        else
            KT_CUDA(cuda_attn_prefill_fa2(a, b.d_tiles, n_tiles,
                                          wide ? 0 : kinds[k].warps, wg, 0));
        KT_CUDA(cudaGetLastError());
        float *out = kt_download(b.a.d_out, n_out, dt);
        double max_err = 0.0;
        for (size_t r = 0; r < rows.size(); r++)
            for (size_t e = 0; e < row; e++) {
                const float o = out[(size_t)rows[r] * row + e];
                const double d = fabs((double)o - ref_c[r * row + e]);
                out_c[r * row + e] = o;
                if (!(d <= max_err)) /* NaN counts as the largest */
                    max_err = isfinite(d) ? d : INFINITY;
            }
        snprintf(what, sizeof(what), "attn prefill kv8 (%s) %s max_err=%.2e",
                 wide ? wkinds[k - n_kinds].name : kinds[k].name, desc,
                 max_err);
        kt_compare(what, out_c, ref_c, n_cmp, kt_tol(dt));
        free(out);
    }
    cudaFree(d_wk);
    cudaFree(d_wv);
    cudaFree(d_pages);
    free(out_c);
    free(ref_c);
    free(ref);
    cudaFree(d_scale);
    batch_free(&b);
}

/* The fused RoPE (cuda_attn_args_t.d_qkv): single-token unmasked decode
 * steps, q and the new key rotated inside the decode kernel and K/V
 * written to the cache.  Reference: rope_kv_ref into copies of the caches,
 * then attn_ref.  Checks the output, the whole K and V caches (the new
 * slots written, nothing else touched), with one split, the planner's
 * and 64-key splits (the writer is the split holding the new key); d_q is
 * poisoned (it must not be read).  RoPE positions differ from the cache
 * positions (d_pos is what rotates). */
static void run_rope_case(int nh, int nkv, int hd, int bs, int rope_half,
                          bool with_bias, const std::vector<int> &ctxs)
{
    const cuda_dtype_t dt = CUDA_DT_BF16;
    attn_case_t c = {nh, nkv, hd, bs, {}};
    for (int ctx : ctxs)
        c.seqs.push_back({ctx, 1, 0});
    batch_t b;
    batch_build(&c, dt, &b);
    if (!cuda_attn_decode_rope_ok(&b.a, b.nt, dt)) {
        batch_free(&b);
        return;
    }
    const int qkv_dim = (nh + 2 * nkv) * hd;
    const size_t cache_n = (size_t)b.n_blocks * bs * nkv * hd;
    const size_t n_out = (size_t)b.nt * nh * hd;
    float *qkv = kt_rand_vec((size_t)b.nt * qkv_dim, -1, 1, dt);
    float *bias = with_bias ? kt_rand_vec(qkv_dim, -0.5f, 0.5f, dt) : NULL;
    std::vector<float> inv_freq(hd / 2);
    std::vector<int> pos(b.nt), slot(b.nt);
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = powf(10000.0f, -2.0f * i / hd);
    for (int t = 0; t < b.nt; t++) {
        int ctx = b.ctx[t];
        pos[t] = ctx + 3 * t + 1;
        slot[t] = b.bt[b.bt_off[t] + ctx / bs] * bs + ctx % bs;
    }
    float *kref = (float *)malloc(sizeof(float) * cache_n);
    float *vref = (float *)malloc(sizeof(float) * cache_n);
    float *qref = (float *)malloc(sizeof(float) * n_out);
    float *ref = (float *)malloc(sizeof(float) * n_out);
    memcpy(kref, b.k, sizeof(float) * cache_n);
    memcpy(vref, b.v, sizeof(float) * cache_n);
    rope_kv_ref(qkv, bias, inv_freq.data(), pos.data(), slot.data(), b.nt,
                nh, nkv, hd, rope_half, qref, kref, vref);
    attn_ref(nh, nkv, hd, bs, b.a.scale, qref, kref, vref, b.bt.data(),
             b.masks.data(), b.kv_len.data(), b.bt_off.data(), b.ctx.data(),
             b.mask_off.data(), b.nt, ref);

    cuda_attn_args_t a = b.a;
    a.d_qkv = kt_upload(qkv, (size_t)b.nt * qkv_dim, dt);
    a.d_qkv_bias = bias ? kt_upload(bias, qkv_dim, dt) : NULL;
    a.d_inv_freq = (const float *)kt_upload(inv_freq.data(), hd / 2,
                                            CUDA_DT_F32);
    a.d_pos = (const int *)kt_upload_raw(pos.data(), sizeof(int) * b.nt);
    a.d_slot = (const int *)kt_upload_raw(slot.data(), sizeof(int) * b.nt);
    a.rope_half = rope_half;
    kt_poison((void *)a.d_q, n_out, dt);
    int max_kv = 1;
    for (int t = 0; t < b.nt; t++)
        max_kv = b.kv_len[t] > max_kv ? b.kv_len[t] : max_kv;
    char desc[96], what[160];
    int pos_c = snprintf(desc, sizeof(desc), "h=%d/%d hd=%d bs=%d %s%s ctx",
                         nh, nkv, hd, bs, rope_half ? "half" : "pairs",
                         bias ? "+bias" : "");
    for (int ctx : ctxs)
        if (pos_c < (int)sizeof(desc) - 8)
            pos_c += snprintf(desc + pos_c, sizeof(desc) - pos_c, " %d", ctx);
    for (int plan = 0; plan < 3; plan++) {
        int ns = 1, sl = 1 << 30;
        if (plan == 1)
            cuda_attn_decode_plan(b.nt, max_kv, nh, nkv, 132, 2, 64, &ns,
                                  &sl);
        if (plan == 2) {
            sl = 64;
            ns = (max_kv + 63) / 64;
        }
        float *d_ws = NULL;
        KT_CUDA(cudaMalloc(&d_ws, 4 * cuda_attn_decode_ws_floats(
                                          b.nt, nh, hd, ns) + 4));
        /* the new slots poisoned: the kernel must write them */
        std::vector<uint16_t> nan_row(hd, 0xFFFF);
        for (int t = 0; t < b.nt; t++)
            for (int h = 0; h < nkv; h++) {
                size_t at = ((size_t)slot[t] * nkv + h) * hd * 2;
                KT_CUDA(cudaMemcpy((char *)a.d_k_cache + at, nan_row.data(),
                                   2 * hd, cudaMemcpyHostToDevice));
                KT_CUDA(cudaMemcpy((char *)a.d_v_cache + at, nan_row.data(),
                                   2 * hd, cudaMemcpyHostToDevice));
            }
        kt_poison(a.d_out, n_out, dt);
        KT_OK(cuda_attn_decode(&a, b.d_all, b.nt, ns, sl, d_ws, dt, 0));
        float *out = kt_download(a.d_out, n_out, dt);
        snprintf(what, sizeof(what), "attn decode+rope %dx%d %s", ns,
                 sl > 1 << 20 ? 0 : sl, desc);
        kt_compare(what, out, ref, n_out, kt_tol(dt));
        free(out);
        float *kc = kt_download(a.d_k_cache, cache_n, dt);
        float *vc = kt_download(a.d_v_cache, cache_n, dt);
        snprintf(what, sizeof(what), "attn decode+rope %dx%d K cache %s", ns,
                 sl > 1 << 20 ? 0 : sl, desc);
        kt_compare(what, kc, kref, cache_n, kt_tol(dt));
        snprintf(what, sizeof(what), "attn decode+rope %dx%d V cache %s", ns,
                 sl > 1 << 20 ? 0 : sl, desc);
        kt_compare(what, vc, vref, cache_n, kt_tol(dt));
        free(kc);
        free(vc);
        cudaFree(d_ws);
    }
    cudaFree((void *)a.d_qkv);
    cudaFree((void *)a.d_qkv_bias);
    cudaFree((void *)a.d_inv_freq);
    cudaFree((void *)a.d_pos);
    cudaFree((void *)a.d_slot);
    free(qkv);
    free(bias);
    free(kref);
    free(vref);
    free(qref);
    free(ref);
    batch_free(&b);
}

/* Times decode attention (KV bandwidth) and prefill (TFLOP/s) at the
 * Llama-3-8B shape. */
static void bench(void)
{
    const int nh = 32, nkv = 8, hd = 128, bs = 16;
    const int dec[][2] = {{1, 8192}, {8, 2048}, {64, 2048}, {64, 8192},
                          {128, 512}};
    printf("\nbench: attention at Llama-3-8B shape (32/8 heads, hd 128, "
           "bf16, block 16), one layer\n");
    for (size_t i = 0; i < sizeof(dec) / sizeof(dec[0]); i++) {
        attn_case_t c = {nh, nkv, hd, bs, {}};
        for (int s = 0; s < dec[i][0]; s++)
            c.seqs.push_back({dec[i][1] - 1, 1, 0});
        batch_t b;
        batch_build(&c, CUDA_DT_BF16, &b);
        int ns, sl;
        cuda_attn_decode_plan(b.nt, dec[i][1], nh, nkv, 132, 2, 64, &ns,
                              &sl);
        float *d_ws = NULL;
        KT_CUDA(cudaMalloc(&d_ws, 4 * cuda_attn_decode_ws_floats(b.nt, nh,
                                                                 hd, ns) + 4));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        /* pass 0: tc, 1: the general kernel */
        static const char *const pass_name[] = {"tc     ", "general"};
        for (int pass = 0; pass < 2; pass++) {
        float ms[20];
        if (pass == 1)
            kt_switch("BT_ATTN_TC", "0");
        for (int it = 0; it < 23; it++) {
            kt_flush_l2();
            cudaEventRecord(e0);
            KT_OK(cuda_attn_decode(&b.a, NULL, b.nt, ns, sl, d_ws,
                                   CUDA_DT_BF16, 0));
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            if (it >= 3)
                cudaEventElapsedTime(&ms[it - 3], e0, e1);
        }
        float med = kt_median(ms, 20);
        double bytes = 2.0 * dec[i][0] * dec[i][1] * nkv * hd * 2;
        printf("decode attn %s batch %3d ctx %5d: %8.1f us  %6.0f GB/s KV "
               "(%2.0f%% of 4.5 TB/s), %d splits of %d\n",
               pass_name[pass], dec[i][0],
               dec[i][1], med * 1e3, bytes / (med * 1e-3) / 1e9,
               100.0 * bytes / (med * 1e-3) / 4.5e12, ns, sl);
        kt_switch("BT_ATTN_TC", NULL);
        }
        cudaFree(d_ws);
        batch_free(&b);
    }
    const int pre[] = {512, 2048, 8192};
    for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++) {
        attn_case_t c = {nh, nkv, hd, bs, {{0, pre[i], 0}}};
        batch_t b;
        batch_build(&c, CUDA_DT_BF16, &b);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        int n_tiles = (int)b.tiles.size() / CUDA_PREFILL_TILE_INTS;
        /* the default (fa2pp128 at head 128), then the kernels it falls
         * back to (cuda_attn_prefill_fa2's wgmma 3, 2, 0); then over FP8
         * KV codes (batch_make_kv8): the default (fa2wqv) and fa2 */
        static const char *const bnames[] = {"default", "fa2pp", "fa2wqv",
                                             "fa2", "kv8 default",
                                             "kv8 fa2"};
        static const int bwgmma[] = {-1, 3, 2, 0, -1, 0};
        const char *f2env = getenv("KT_ATTN_FA2");
        const int n_pass = f2env && strcmp(f2env, "0") == 0 ? 1 : 6;
        float *d_scale = NULL;
        for (int pass = 0; pass < n_pass; pass++) {
        float ms[10];
        if (pass == 4)
            d_scale = batch_make_kv8(&c, &b);
        for (int it = 0; it < 12; it++) {
            cudaEventRecord(e0);
            if (bwgmma[pass] < 0)
                KT_OK(cuda_attn_prefill(&b.a, b.d_tiles, n_tiles,
                                        CUDA_DT_BF16, 0));
            else
                KT_CUDA(cuda_attn_prefill_fa2(&b.a, b.d_tiles, n_tiles, 0,
                                              bwgmma[pass], 0));
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            if (it >= 2)
                cudaEventElapsedTime(&ms[it - 2], e0, e1);
        }
        float med = kt_median(ms, 10);
        double flops = 4.0 * nh * hd * (double)pre[i] * (pre[i] + 1) / 2;
        printf("prefill attn %-11s %5d tokens: %8.1f us  %6.1f TFLOP/s "
               "(causal FLOPs)\n", bnames[pass], pre[i],
               med * 1e3,
               flops / (med * 1e-3) / 1e12);
        }
        cudaFree(d_scale);
        batch_free(&b);
    }
}

/* FP8 KV decode at serving shapes (the mixed steps of an aggregated
 * worker under a cold burst: hundreds of per-token rows, decode rows and
 * the short prompt pieces the tiled prefill does not take, padding rows
 * with kv_len 0, kv lengths 0 .. max_kv that are mostly not multiples of
 * 64, 1 .. 64 splits, a pool of ~100K blocks with the block tables
 * pointing at its top): cuda_attn_decode through the tensor-core KV8
 * kernel (attn_decode_tc_kernel<HD, false, true>) and once through the
 * general kernel, against a double-precision reference over the
 * dequantized codes.  Every block of the pool that no table names holds
 * NaN codes (0x7F), so a row read from a wrong block shows as a
 * non-finite output; the last block of the pool is always named (a
 * copy past the pool's end faults).  Each configuration is launched
 * `reps` times back to back on the stream (PDL: the next launch's early
 * copies overlap the previous one's tail, as layers do in the engine)
 * and its name printed before the launch, so a crash names it.  Not in
 * the bf16 batch_build path: its host copy of the whole pool would not
 * fit; the sequences draw their blocks (with repeats) from n_phys
 * distinct blocks. */
static void run_kv8_decode_stress(int nh, int nkv, int hd, int bs,
                                  int n_tok, int max_kv, long pool_blocks,
                                  int n_phys, int reps, uint64_t seed)
{
    const cuda_dtype_t dt = CUDA_DT_BF16;
    const int G = nh / nkv;
    const size_t blk_elems = (size_t)bs * nkv * hd; /* = bytes (codes) */
    kt_seed(seed);

    /* the physical blocks: distinct ids at the top of the pool, the last
     * one included */
    std::vector<int> phys;
    {
        long lo = pool_blocks - 3L * n_phys;
        if (lo < 0)
            lo = 0;
        std::vector<int> all;
        for (long i = lo; i < pool_blocks - 1; i++)
            all.push_back((int)i);
        for (int i = (int)all.size() - 1; i > 0; i--) {
            int j = (int)(kt_u32() % (uint32_t)(i + 1));
            int t = all[i]; all[i] = all[j]; all[j] = t;
        }
        phys.push_back((int)(pool_blocks - 1));
        for (int i = 0; i < n_phys - 1 && i < (int)all.size(); i++)
            phys.push_back(all[i]);
        n_phys = (int)phys.size();
    }

    /* scales and codes of the physical blocks; kf / vf: what they mean */
    std::vector<float> scale(2 * nkv);
    for (int h = 0; h < nkv; h++) {
        scale[h] = 3.0f / 448.0f * kt_uniform(1.0f, 3.0f);
        scale[nkv + h] = 1.0f / 448.0f * kt_uniform(1.0f, 3.0f);
    }
    std::vector<uint8_t> kc((size_t)n_phys * blk_elems),
        vc((size_t)n_phys * blk_elems);
    std::vector<float> kf(kc.size()), vf(vc.size());
    for (size_t i = 0; i < kc.size(); i++) {
        const int kvh = (int)((i / hd) % nkv);
        kc[i] = bt_f32_to_e4m3(kt_uniform(-3.0f, 3.0f) / scale[kvh]);
        vc[i] = bt_f32_to_e4m3(kt_uniform(-1.0f, 1.0f) / scale[nkv + kvh]);
        kf[i] = bt_e4m3_to_f32(kc[i]) * scale[kvh];
        vf[i] = bt_e4m3_to_f32(vc[i]) * scale[nkv + kvh];
    }

    /* the step's tokens: decode rows (among them every tile and block
     * edge), short prompt pieces (2..15 tokens, causal), tiled prompt
     * chunks (>= 16 tokens: in the batch, not in the decode kernel's
     * list), then padding rows (kv_len 0, table offset 0) */
    std::vector<int> kv_len, ctxv, bt_off, bt, gen;
    std::vector<int> bt_phys; /* table entry -> index into phys */
    static const int edges[] = {1,   2,   15,  16,  17,   63,   64,  65,
                                127, 128, 129, 255, 256,  257,  511, 512,
                                513, 1000, 2047, 2048, 2049};
    int n_edges = (int)(sizeof(edges) / sizeof(edges[0]));
    int t = 0, si = 0;
    const int n_pad = 13;
    while (t < n_tok - n_pad) {
        int n, ctx;
        bool in_gen = true;
        uint32_t kind = kt_u32() % 10;
        if (si < n_edges && edges[si] <= max_kv) {
            n = 1;
            ctx = edges[si] - 1;
        } else if (kind < 6) {
            n = 1;
            ctx = (int)(kt_u32() % (uint32_t)max_kv);
        } else if (kind < 9) {
            n = 2 + (int)(kt_u32() % 14);
            ctx = (int)(kt_u32() % (uint32_t)(max_kv - n + 1));
        } else {
            n = 16 + (int)(kt_u32() % 49);
            ctx = (int)(kt_u32() % (uint32_t)(max_kv - n + 1));
            in_gen = false;
        }
        si++;
        if (t + n > n_tok - n_pad)
            n = n_tok - n_pad - t;
        const int nb = (ctx + n + bs - 1) / bs;
        const int off = (int)bt.size();
        for (int i = 0; i < nb; i++) {
            int p = (int)(kt_u32() % (uint32_t)n_phys);
            if (i == nb - 1 && (kt_u32() & 3) == 0)
                p = 0; /* the pool's last block */
            bt_phys.push_back(p);
            bt.push_back(phys[p]);
        }
        for (int i = 0; i < n; i++, t++) {
            kv_len.push_back(ctx + i + 1);
            ctxv.push_back(ctx);
            bt_off.push_back(off);
            if (in_gen)
                gen.push_back(t);
        }
    }
    for (; t < n_tok; t++) {
        kv_len.push_back(0);
        ctxv.push_back(0);
        bt_off.push_back(0);
        gen.push_back(t);
    }
    if (bt.empty()) {
        bt.push_back(phys[0]);
        bt_phys.push_back(0);
    }
    const int nt = n_tok, ng = (int)gen.size();
    int mkv = 1;
    for (int i = 0; i < ng; i++)
        mkv = kv_len[gen[i]] > mkv ? kv_len[gen[i]] : mkv;

    /* q and the reference (double, the gen rows only) */
    float *q = kt_rand_vec((size_t)nt * nh * hd, -1, 1, dt);
    const float scl = 1.0f / sqrtf((float)hd);
    const size_t row = (size_t)nh * hd;
    std::vector<float> ref((size_t)ng * row, 0.0f);
    {
        std::vector<double> s, acc(hd);
        for (int gi = 0; gi < ng; gi++) {
            const int tk = gen[gi], L = kv_len[tk];
            s.resize(L > 0 ? L : 1);
            for (int h = 0; h < nh; h++) {
                const int kvh = h / G;
                const float *qh = q + ((size_t)tk * nh + h) * hd;
                double mx = -INFINITY;
                for (int k = 0; k < L; k++) {
                    const int p = bt_phys[bt_off[tk] + k / bs];
                    const float *kr = kf.data() + (size_t)p * blk_elems +
                                      ((size_t)(k % bs) * nkv + kvh) * hd;
                    double d = 0.0;
                    for (int e = 0; e < hd; e++)
                        d += (double)qh[e] * kr[e];
                    s[k] = d * scl;
                    mx = s[k] > mx ? s[k] : mx;
                }
                double sum = 0.0;
                for (int e = 0; e < hd; e++)
                    acc[e] = 0.0;
                for (int k = 0; k < L; k++) {
                    const int p = bt_phys[bt_off[tk] + k / bs];
                    const float *vr = vf.data() + (size_t)p * blk_elems +
                                      ((size_t)(k % bs) * nkv + kvh) * hd;
                    const double w = exp(s[k] - mx);
                    sum += w;
                    for (int e = 0; e < hd; e++)
                        acc[e] += w * vr[e];
                }
                for (int e = 0; e < hd; e++)
                    ref[(size_t)gi * row + (size_t)h * hd + e] =
                        L > 0 ? (float)(acc[e] / sum) : 0.0f;
            }
        }
    }

    /* device: the whole pool (NaN codes), the physical blocks, metadata */
    const size_t pool_bytes = (size_t)pool_blocks * blk_elems;
    void *d_k = NULL, *d_v = NULL;
    KT_CUDA(cudaMalloc(&d_k, pool_bytes));
    KT_CUDA(cudaMalloc(&d_v, pool_bytes));
    KT_CUDA(cudaMemset(d_k, 0x7F, pool_bytes));
    KT_CUDA(cudaMemset(d_v, 0x7F, pool_bytes));
    for (int p = 0; p < n_phys; p++) {
        KT_CUDA(cudaMemcpy((uint8_t *)d_k + (size_t)phys[p] * blk_elems,
                           kc.data() + (size_t)p * blk_elems, blk_elems,
                           cudaMemcpyHostToDevice));
        KT_CUDA(cudaMemcpy((uint8_t *)d_v + (size_t)phys[p] * blk_elems,
                           vc.data() + (size_t)p * blk_elems, blk_elems,
                           cudaMemcpyHostToDevice));
    }
    std::vector<int> mask_off(nt, -1);
    uint8_t mask0 = 0;
    cuda_attn_args_t a;
    args_upload_meta(&a, nh, nkv, hd, bs, (long long)pool_blocks * bs, bt,
                     &mask0, 1, kv_len.data(), bt_off.data(), ctxv.data(),
                     mask_off.data(), nt);
    a.d_q = kt_upload(q, (size_t)nt * row, dt);
    a.d_k_cache = d_k;
    a.d_v_cache = d_v;
    a.d_kv_scale = (const float *)kt_upload_raw(scale.data(),
                                                sizeof(float) * scale.size());
    a.d_out = kt_poisoned((size_t)nt * row, dt);
    int *d_gen = (int *)kt_upload_raw(gen.data(), sizeof(int) * ng);

    /* split configurations: the planner's (as cuda_forward_ex: at most
     * CUDA_MAX_SPLITS = 64 and what a 256-row workspace holds), that
     * rounded up to a power of two (graph steps: extra splits find no
     * keys), and forced lengths 64 .. 4096 */
    struct { int ns, sl; const char *name; } cfg[10];
    int n_cfg = 0;
    {
        int ms = (int)((size_t)256 * 64 / (size_t)(ng > 0 ? ng : 1));
        ms = ms < 1 ? 1 : ms > 64 ? 64 : ms;
        int ns, sl;
        cuda_attn_decode_plan(ng, mkv, nh, nkv, 132,
                              cuda_attn_decode_blocks_per_sm(hd, true,
                                                             nh / nkv),
                              ms,
                              &ns, &sl);
        cfg[n_cfg++] = {ns, sl, "planned"};
        int p2 = 1;
        while (p2 < ns)
            p2 *= 2;
        if (p2 != ns)
            cfg[n_cfg++] = {p2, sl, "planned pow2"};
        static const int lens[] = {64, 128, 256, 1024, 4096};
        for (int len : lens) {
            int n2 = (mkv + len - 1) / len;
            if (n2 <= 64)
                cfg[n_cfg++] = {n2, len, "forced"};
        }
        cfg[n_cfg++] = {1, 1 << 30, "one split"};
    }
    std::vector<float> out_c((size_t)ng * row);
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            kt_switch("BT_ATTN_TC", "0");
        for (int c = 0; c < n_cfg; c++) {
            if (pass && c > 0)
                break; /* the general kernel: the planner's split only */
            const int ns = cfg[c].ns, sl = cfg[c].sl;
            float *d_ws = NULL;
            KT_CUDA(cudaMalloc(&d_ws, 4 * cuda_attn_decode_ws_floats(
                                              ng, nh, hd, ns) + 4));
            char what[200];
            snprintf(what, sizeof(what),
                     "attn decode kv8 stress%s h=%d/%d hd=%d bs=%d "
                     "rows=%d/%d max_kv=%d pool=%ld %s %dx%d",
                     pass ? " (general)" : " (tensor cores)", nh, nkv, hd,
                     bs, ng, nt, mkv, pool_blocks, cfg[c].name, ns, sl);
            printf("RUN  %s x%d\n", what, reps);
            fflush(stdout);
            kt_poison(a.d_out, (size_t)nt * row, dt);
            for (int r = 0; r < reps; r++)
                KT_OK(cuda_attn_decode(&a, d_gen, ng, ns, sl, d_ws, dt, 0));
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) {
                printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
                fflush(stdout);
                exit(1);
            }
            float *out = kt_download(a.d_out, (size_t)nt * row, dt);
            for (int gi = 0; gi < ng; gi++)
                memcpy(out_c.data() + (size_t)gi * row,
                       out + (size_t)gen[gi] * row, sizeof(float) * row);
            kt_compare(what, out_c.data(), ref.data(), out_c.size(),
                       kt_tol(dt));
            free(out);
            cudaFree(d_ws);
        }
        if (pass)
            kt_switch("BT_ATTN_TC", NULL);
    }
    free(q);
    cudaFree((void *)a.d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree((void *)a.d_kv_scale);
    cudaFree((void *)a.d_block_tables);
    cudaFree((void *)a.d_masks);
    cudaFree((void *)a.d_kv_len);
    cudaFree((void *)a.d_bt_off);
    cudaFree((void *)a.d_ctx_len);
    cudaFree((void *)a.d_mask_off);
    cudaFree(a.d_out);
    cudaFree(d_gen);
}

int main(int argc, char **argv)
{
    /* line-buffered: a bench killed by its timeout keeps its rows */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* --kv8-stress [rows [pool_blocks [reps]]]: only the FP8 KV decode
     * at serving shapes (run_kv8_decode_stress), more seeds and
     * repetitions than the default run */
    if (argc > 1 && strcmp(argv[1], "--kv8-stress") == 0) {
        const int rows = argc > 2 ? atoi(argv[2]) : 640;
        const long pool = argc > 3 ? atol(argv[3]) : 100000;
        const int reps = argc > 4 ? atoi(argv[4]) : 8;
        for (uint64_t s = 1; s <= 3; s++)
            run_kv8_decode_stress(32, 8, 128, 16, rows, 2200, pool, 1024,
                                  reps, s);
        /* the failing steps' decode share: tens of rows, many splits */
        for (uint64_t s = 4; s <= 6; s++)
            run_kv8_decode_stress(32, 8, 128, 16, 24 + 16 * (int)s, 2200,
                                  pool, 1024, reps, s);
        run_kv8_decode_stress(32, 8, 64, 16, rows, 2200, pool, 1024, reps,
                              7);
        run_kv8_decode_stress(32, 4, 128, 64, rows, 4100, pool / 4, 256,
                              reps, 8);
        return kt_finish("test_attn");
    }
    std::vector<attn_case_t> cases = {
        /* aidreams / stories shapes: tiny heads */
        {4, 4, 16, 8, {{0, 1, 0}, {5, 1, 0}, {0, 20, 0}, {3, 17, 0}}},
        {8, 4, 8, 16, {{0, 7, 0}, {40, 1, 0}, {9, 5, 1}, {100, 1, 0}}},
        /* Llama-3 GQA 4, mixed batch incl. chunked prefill and a tree */
        {32, 8, 128, 16, {{1000, 1, 0}, {0, 100, 0}, {77, 70, 0},
                          {20, 9, 1}, {513, 1, 0}, {0, 1, 0}}},
        {32, 8, 128, 64, {{3000, 1, 0}, {130, 33, 1}, {64, 64, 0}}},
        /* odd groups and sizes */
        {28, 4, 128, 8, {{257, 1, 0}, {0, 31, 0}, {11, 3, 0}}},
        {12, 2, 64, 16, {{0, 129, 0}, {700, 1, 0}}},
        {16, 1, 256, 16, {{50, 1, 0}, {0, 40, 0}, {33, 20, 1}}},
        {8, 8, 32, 64, {{5000, 1, 0}, {1, 2, 0}}},
        /* tensor-core decode: groups 16 and 8, long split, odd lengths */
        {32, 2, 128, 16, {{2500, 1, 0}, {5, 1, 0}, {0, 1, 0}, {61, 7, 1}}},
        {16, 2, 64, 8, {{4200, 1, 0}, {63, 1, 0}, {64, 1, 0}, {10, 6, 1}}},
        /* prefill: consecutive 64-query tiles and lone tiles of several
         * sequences back to back, a chunk after a long prefix, a masked
         * pair */
        {32, 8, 128, 16, {{0, 129, 0}, {0, 64, 0}, {1000, 200, 0},
                          {0, 65, 0}, {30, 100, 1}}},
        {8, 2, 64, 16, {{0, 256, 0}, {3, 191, 0}, {0, 1, 0}}},
        /* prefill: several key tiles, full and diagonal, masked */
        {32, 8, 128, 16, {{0, 300, 0}, {200, 150, 0}, {5, 3, 0}}},
        {8, 2, 64, 8, {{0, 200, 0}, {50, 77, 1}, {300, 1, 0}}},
        /* fa2 prefill (GQA units in a block): group 8 at head 128 with
         * block 8, odd lengths after long prefixes (a chunk starting
         * mid-tile and mid-block), a partial last tile of 1-15 rows */
        {32, 4, 128, 8, {{0, 333, 0}, {1500, 131, 0}, {7, 64, 0},
                         {0, 1, 0}}},
        /* group 1 at head 64 with block 64, a masked chunk after 64 */
        {8, 8, 64, 64, {{0, 257, 0}, {100, 200, 0}, {64, 65, 1}}},
        /* group 4 at head 128, block 16: prefix not a multiple of 64,
         * 17-token chunk (one full sub-tile + 1 row), masked 40 */
        {16, 4, 128, 16, {{129, 190, 0}, {0, 17, 0}, {45, 40, 1}}},
        /* group 3 (odd: 4 warps per block) at head 64, block 8 */
        {12, 4, 64, 8, {{0, 150, 0}, {300, 99, 0}, {2, 1, 0}}},
        /* group 8 at head 64, block 64: many tiles, chunk at 1000 */
        {16, 2, 64, 64, {{0, 449, 0}, {1000, 80, 0}}},
    };
    /* more items than the H200's 2 x 132 block slots: 40 decode tokens x
     * 8 KV heads, lengths from 1 to 2600 keys, one masked draft tree;
     * again at head 64, block 8 */
    for (int v = 0; v < 2; v++) {
        attn_case_t big = {32, 8, v ? 64 : 128, v ? 8 : 16, {}};
        for (int i = 0; i < 40; i++)
            big.seqs.push_back({(i * 977 + 13 * v) % 2600, 1, 0});
        big.seqs.push_back({300, 5, 1});
        cases.push_back(big);
    }
    kt_seed(6);
    for (int dti = 0; dti < 2; dti++)
        for (const attn_case_t &c : cases)
            run_case(&c, dti ? CUDA_DT_BF16 : CUDA_DT_F32);
    /* FP8 KV prefill (run_kv8_case): GQA 1, 4, 7 and 8 at head 128 and
     * 1, 3, 4 and 8 at head 64; chunks after cached prefixes that are
     * not multiples of 16 or 64 (a chunk starting mid-tile and
     * mid-block), masked chunks, lengths of 17 (one sub-tile + 1 row),
     * 65, 95, 131 ...; blocks of 8, 16 and 64 (in order or scattered as
     * batch_build draws); head 32 and 256 through the shared-memory
     * kernel */
    const attn_case_t kv8_cases[] = {
        {32, 8, 128, 16, {{0, 333, 0}, {1500, 131, 0}, {30, 100, 1},
                          {0, 17, 0}, {5, 1, 0}}},
        {32, 4, 128, 8, {{0, 200, 0}, {700, 77, 0}, {64, 65, 1}}},
        {8, 8, 128, 64, {{0, 257, 0}, {100, 150, 0}, {3, 40, 1}}},
        {28, 4, 128, 16, {{0, 95, 0}, {257, 64, 1}, {1, 300, 0}}},
        {8, 8, 64, 64, {{0, 257, 0}, {100, 200, 0}, {64, 65, 1}}},
        {16, 4, 64, 16, {{129, 190, 0}, {0, 17, 0}, {45, 40, 1}}},
        {12, 4, 64, 8, {{0, 150, 0}, {300, 99, 0}, {2, 1, 0}}},
        {16, 2, 64, 8, {{0, 449, 0}, {1000, 80, 0}, {3, 31, 1}}},
        {8, 2, 32, 16, {{0, 70, 0}, {20, 33, 1}}},
        {16, 1, 256, 16, {{0, 40, 0}, {33, 20, 1}}},
    };
    for (const attn_case_t &c : kv8_cases)
        run_kv8_case(&c);
    /* FP8 KV decode at serving shapes (llama3-8b: GQA 4, head 128,
     * block 16): 640 rows, then 40 rows (many splits), a pool of 100K
     * blocks */
    run_kv8_decode_stress(32, 8, 128, 16, 640, 2200, 100000, 1024, 2, 1);
    run_kv8_decode_stress(32, 8, 128, 16, 40, 2200, 100000, 1024, 2, 2);
    /* fused RoPE: GQA 4 / 4 / 16 / 1, both layouts, bias or not, a first
     * token (ctx 0), tile and block edges, long contexts (splits) */
    run_rope_case(32, 8, 128, 16, 1, true, {0, 1, 63, 64, 2000, 17});
    run_rope_case(8, 2, 64, 8, 0, false, {5, 700, 128, 0});
    run_rope_case(32, 2, 128, 64, 1, false, {4000, 5, 64});
    run_rope_case(8, 8, 64, 16, 0, true, {300, 1, 1025});
    /* 1-2 token steps: with splits of <= 2 tiles the new-row kernel
     * instance (the new key's row left out of its early tile and written
     * there by the prologue): the key first, last and inside a tile, the
     * first token */
    run_rope_case(32, 8, 128, 16, 1, true, {2000});
    run_rope_case(32, 8, 128, 16, 1, false, {63, 64});
    run_rope_case(8, 2, 64, 8, 0, true, {0, 127});
    run_rope_case(32, 2, 128, 64, 1, false, {128});
    run_rope_case(8, 8, 64, 16, 0, false, {1, 95});
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        bench();
    return kt_finish("test_attn");
}
