/*
 * engine.c - model + tokenizer + backend + KV allocator, and sequences
 * stepped together through one batched forward.
 */
#include "engine.h"

#include <string.h>
#include <sys/stat.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

struct engine_s {
    engine_config_t cfg;
    model_t *model;
    tok_t *tok;               /* NULL when no tokenizer was given */
    backend_t *backend;
    kv_allocator_t *kv;
    int block_size;
    int max_context;
    int vocab_size;
    sampler_t **row_samplers; /* (max_seqs) sampler of each logits row */
    int *row_ids;             /* (max_seqs) token sampled for each row */
    backend_seq_t *batch_seqs;/* (max_seqs) */
    int *batch_index;         /* (max_seqs) engine_step slot of each row */
    grammar_vocab_t *gvocab;  /* token bytes for grammar masks, built on
                               * first use (engine_grammar_vocab) */
    float *lp_logits;         /* (max_seqs + ENGINE_LP_ROWS, vocab) rows of
                               * prompt positions (prompt logprobs), made
                               * on first use */
};

/* Prompt logprobs need a logits row per prompt position: one such
 * sequence per step feeds at most this many tokens, so the rows fit. */
#define ENGINE_LP_ROWS 64

struct engine_seq_s {
    int *tokens;      /* (cap) prompt then generated ids */
    int n_tokens;
    int cap;
    int n_prompt;
    int n_cached;     /* tokens whose K/V are in the pool */
    int *blocks;      /* (max_blocks) block table */
    int n_blocks;
    int max_blocks;
    sampler_t *sampler;
    grammar_t *grammar;       /* structured output (borrowed), or NULL */
    grammar_state_t gstate;   /* the grammar's state after the tokens */
    int g_start;              /* index of the first constrained token */
    uint64_t *gmask;          /* (mask words) this step's allowed tokens,
                               * the sampler's mask */
    sampler_prompt_lp_t *plp; /* the prompt's logprobs (params
                               * prompt_logprobs), or NULL */
};

/* A Hugging Face model directory that holds tokenizer.json brings its own
 * tokenizer: returns the directory (in buf) or NULL. */
static const char *engine_find_tokenizer(const char *model_path, char *buf,
                                         size_t cap)
{
    struct stat st;
    size_t len;

    if (strncmp(model_path, "synth:", 6) == 0 ||
        stat(model_path, &st) != 0)
        return NULL;
    len = strlen(model_path);
    if (!S_ISDIR(st.st_mode)) {
        const char *slash = strrchr(model_path, '/');
        /* .../config.json: look in its directory */
        if (slash == NULL || strcmp(slash + 1, "config.json") != 0)
            return NULL;
        len = (size_t)(slash - model_path);
    }
    if (len + sizeof("/tokenizer.json") > cap)
        return NULL;
    memcpy(buf, model_path, len);
    strcpy(buf + len, "/tokenizer.json");
    if (stat(buf, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    buf[len] = '\0';
    return buf;
}

void engine_config_init(engine_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = "auto";
    backend_config_init(&cfg->backend);
}

bt_status_t engine_create(const engine_config_t *cfg, engine_t **engine_p)
{
    engine_t *engine;
    const model_config_t *mcfg;
    const char *tok_path;
    char auto_tok[4096];
    bt_status_t status;

    if (cfg->model_path == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE", "no model given");
    engine = bt_calloc(1, sizeof(*engine), "engine");
    if (engine == NULL)
        return BT_ERR_NO_MEMORY;
    engine->cfg = *cfg;
    {
        /* large synthesized models are generated on the GPU (seconds, no
         * host copy: synth:llama3-70b is 141 GB) */
        const char *dev = backend_resolve(cfg->device);
        unsigned flags = dev != NULL && strcmp(dev, "cuda") == 0
                             ? MODEL_LOAD_SYNTH_LAZY_LARGE : 0;

        status = model_load_ex(cfg->model_path, flags, &engine->model);
    }
    if (status != BT_OK)
        goto err_free;
    mcfg = model_config(engine->model);
    engine->vocab_size = mcfg->vocab_size;
    tok_path = cfg->tokenizer_path;
    if (tok_path == NULL)
        tok_path = engine_find_tokenizer(cfg->model_path, auto_tok,
                                         sizeof(auto_tok));
    if (tok_path != NULL) {
        status = tok_load(tok_path, mcfg->vocab_size, &engine->tok);
        if (status != BT_OK)
            goto err_model;
    }
    status = backend_create(cfg->device, engine->model, &cfg->backend,
                            &engine->backend);
    if (status != BT_OK)
        goto err_tok;
    /* the sizes the backend chose (KV from memory, auto max_seqs) */
    engine->cfg.backend = *backend_config(engine->backend);
    status = kv_allocator_create(engine->cfg.backend.n_kv_blocks, &engine->kv);
    if (status != BT_OK)
        goto err_backend;
    engine->block_size = engine->cfg.backend.block_size;
    engine->max_context = mcfg->max_seq_len;
    {
        int seqs = engine->cfg.backend.max_seqs + ENGINE_LP_ROWS;

        engine->row_samplers = bt_calloc((size_t)seqs,
                                         sizeof(*engine->row_samplers),
                                         "engine_rows");
        engine->row_ids = bt_calloc((size_t)seqs, sizeof(int),
                                    "engine_rows");
        engine->batch_seqs = bt_calloc((size_t)seqs,
                                       sizeof(*engine->batch_seqs),
                                       "engine_batch");
        engine->batch_index = bt_calloc((size_t)seqs, sizeof(int),
                                        "engine_batch");
    }
    if (engine->row_samplers == NULL || engine->row_ids == NULL ||
        engine->batch_seqs == NULL ||
        engine->batch_index == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_bufs;
    }
    BT_LOG_INFO("ENGINE", "model %s on %s: %d layers, dim %d, vocab %d, "
                "context %d, KV %d blocks x %d tokens, %d seqs a step",
                cfg->model_path, backend_name(engine->backend),
                mcfg->n_layers, mcfg->dim, mcfg->vocab_size,
                engine->max_context, engine->cfg.backend.n_kv_blocks,
                engine->block_size, engine->cfg.backend.max_seqs);
    *engine_p = engine;
    return BT_OK;

err_bufs:
    bt_free(engine->row_samplers);
    bt_free(engine->row_ids);
    bt_free(engine->batch_seqs);
    bt_free(engine->batch_index);
    bt_free(engine->lp_logits);
    kv_allocator_destroy(&engine->kv);
err_backend:
    backend_destroy(&engine->backend);
err_tok:
    tok_destroy(&engine->tok);
err_model:
    model_destroy(&engine->model);
err_free:
    bt_free(engine);
    return status;
}

void engine_destroy(engine_t **engine_p)
{
    engine_t *engine = *engine_p;

    if (engine == NULL)
        return;
    bt_free(engine->row_samplers);
    bt_free(engine->row_ids);
    bt_free(engine->batch_seqs);
    bt_free(engine->batch_index);
    bt_free(engine->lp_logits);
    kv_allocator_destroy(&engine->kv);
    backend_destroy(&engine->backend);
    grammar_vocab_destroy(&engine->gvocab);
    tok_destroy(&engine->tok);
    model_destroy(&engine->model);
    bt_free(engine);
    *engine_p = NULL;
}

const model_t *engine_model(const engine_t *engine)
{
    return engine->model;
}

const tok_t *engine_tokenizer(const engine_t *engine)
{
    return engine->tok;
}

backend_t *engine_backend(engine_t *engine)
{
    return engine->backend;
}

kv_allocator_t *engine_kv(engine_t *engine)
{
    return engine->kv;
}

int engine_block_size(const engine_t *engine)
{
    return engine->block_size;
}

int engine_max_context(const engine_t *engine)
{
    return engine->max_context;
}

bt_status_t engine_seq_create(engine_t *engine, const int *prompt,
                              int n_prompt, const sampler_params_t *params,
                              engine_seq_t **seq_p)
{
    engine_seq_t *seq;
    bt_status_t status;

    if (prompt == NULL || n_prompt <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE", "empty prompt");
    if (n_prompt > engine->max_context)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "prompt of %d tokens exceeds the model context of "
                        "%d tokens", n_prompt, engine->max_context);
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= engine->vocab_size)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "prompt token %d (id %d) is outside the "
                            "vocabulary of %d", i, prompt[i],
                            engine->vocab_size);
    }
    seq = bt_calloc(1, sizeof(*seq), "engine_seq");
    if (seq == NULL)
        return BT_ERR_NO_MEMORY;
    status = sampler_create(params, engine->vocab_size, &seq->sampler);
    if (status != BT_OK)
        goto err_free;
    seq->cap = engine->max_context + 1;
    seq->tokens = bt_malloc(sizeof(int) * (size_t)seq->cap, "engine_seq");
    seq->max_blocks = (int)BT_DIV_UP(seq->cap, engine->block_size);
    seq->blocks = bt_malloc(sizeof(int) * (size_t)seq->max_blocks,
                            "engine_seq");
    if (seq->tokens == NULL || seq->blocks == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_bufs;
    }
    if (params->prompt_logprobs) {
        status = sampler_prompt_lp_create(n_prompt,
                                          params->prompt_top_logprobs,
                                          &seq->plp);
        if (status != BT_OK)
            goto err_bufs;
    }
    memcpy(seq->tokens, prompt, sizeof(int) * (size_t)n_prompt);
    seq->n_tokens = n_prompt;
    seq->n_prompt = n_prompt;
    for (int i = 0; i < n_prompt; i++)
        sampler_observe(seq->sampler, prompt[i]);
    *seq_p = seq;
    return BT_OK;

err_bufs:
    sampler_prompt_lp_destroy(&seq->plp);
    bt_free(seq->tokens);
    bt_free(seq->blocks);
    sampler_destroy(&seq->sampler);
err_free:
    bt_free(seq);
    return status;
}

void engine_seq_destroy(engine_t *engine, engine_seq_t **seq_p)
{
    engine_seq_t *seq = *seq_p;

    if (seq == NULL)
        return;
    kv_allocator_release(engine->kv, seq->n_blocks, seq->blocks);
    sampler_destroy(&seq->sampler);
    sampler_prompt_lp_destroy(&seq->plp);
    bt_free(seq->gmask);
    bt_free(seq->tokens);
    bt_free(seq->blocks);
    bt_free(seq);
    *seq_p = NULL;
}

int engine_seq_len(const engine_seq_t *seq)
{
    return seq->n_tokens;
}

int engine_seq_cached(const engine_seq_t *seq)
{
    return seq->n_cached;
}

int engine_seq_prompt_len(const engine_seq_t *seq)
{
    return seq->n_prompt;
}

const int *engine_seq_tokens(const engine_seq_t *seq)
{
    return seq->tokens;
}

int engine_seq_n_generated(const engine_seq_t *seq)
{
    return seq->n_tokens - seq->n_prompt;
}

const sampler_prompt_lp_t *engine_seq_prompt_logprobs(
    const engine_seq_t *seq)
{
    return seq->plp;
}

/* Whether seq's next chunk needs a logits row per position. */
static bool engine_seq_lp_rows(const engine_seq_t *seq)
{
    return seq->plp != NULL && seq->n_cached < seq->n_prompt;
}

/* Tokens to feed for seq this step, given the remaining budget.  One
 * sequence a step gathers prompt logprobs (*lp_used), ENGINE_LP_ROWS
 * tokens at most; another waits for the next step. */
static int engine_seq_take(const engine_seq_t *seq, int budget,
                           bool *lp_used)
{
    int take = BT_MIN(seq->n_tokens - seq->n_cached, budget);

    if (take > 0 && engine_seq_lp_rows(seq)) {
        if (*lp_used)
            return 0;
        *lp_used = true;
        take = BT_MIN(take, ENGINE_LP_ROWS);
    }
    return take;
}

bt_status_t engine_step(engine_t *engine, engine_seq_t **seqs, int n,
                        int token_budget, int *sampled)
{
    const backend_config_t *bcfg = &engine->cfg.backend;
    int budget, need_blocks = 0, n_batch = 0, n_rows = 0;
    bool lp_plan = false, lp_used = false;
    int lp_b = -1; /* the batch entry with a row per position */
    backend_batch_t batch;
    bt_status_t status;

    if (n <= 0 || n > bcfg->max_seqs)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "step over %d sequences (1..%d allowed)", n,
                        bcfg->max_seqs);
    budget = token_budget > 0 ? BT_MIN(token_budget, bcfg->max_batch_tokens)
                              : bcfg->max_batch_tokens;

    /* Plan: how many tokens each sequence feeds and the blocks it needs.
     * Blocks are checked for all sequences before any is taken, so a full
     * pool changes nothing. */
    for (int i = 0, left = budget; i < n; i++) {
        engine_seq_t *seq = seqs[i];
        int take = engine_seq_take(seq, left, &lp_plan);

        sampled[i] = -1;
        if (take <= 0)
            continue;
        if (seq->n_cached + take > engine->max_context)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "sequence %d would exceed the context of %d", i,
                            engine->max_context);
        need_blocks += (int)BT_DIV_UP(seq->n_cached + take,
                                      engine->block_size) - seq->n_blocks;
        left -= take;
        if (seq->grammar != NULL && seq->n_cached + take == seq->n_tokens) {
            /* the grammar's mask for the row it samples (the sampler reads
             * gmask); here, so that a failure changes nothing */
            status = grammar_mask(seq->grammar, seq->gstate, seq->gmask);
            if (status != BT_OK)
                return status;
        }
    }
    if (need_blocks > kv_allocator_free_count(engine->kv))
        return BT_ERROR(BT_ERR_NO_RESOURCE, "KV",
                        "KV pool full: step needs %d blocks, %d free",
                        need_blocks, kv_allocator_free_count(engine->kv));
    if (lp_plan && engine->lp_logits == NULL) {
        engine->lp_logits = bt_malloc(sizeof(float) * (size_t)engine->vocab_size *
                                          (size_t)(bcfg->max_seqs +
                                                   ENGINE_LP_ROWS),
                                      "engine_lp_logits");
        if (engine->lp_logits == NULL)
            return BT_ERR_NO_MEMORY;
    }

    for (int i = 0, left = budget; i < n; i++) {
        engine_seq_t *seq = seqs[i];
        bool lp_rows = engine_seq_lp_rows(seq) && !lp_used;
        int take = engine_seq_take(seq, left, &lp_used);
        int want;
        backend_seq_t *bs;

        if (take <= 0)
            continue;
        want = (int)BT_DIV_UP(seq->n_cached + take, engine->block_size);
        if (want > seq->n_blocks) {
            status = kv_allocator_alloc(engine->kv, want - seq->n_blocks,
                                        seq->blocks + seq->n_blocks);
            BT_ASSERT(status == BT_OK); /* checked above */
            seq->n_blocks = want;
        }
        bs = &engine->batch_seqs[n_batch];
        memset(bs, 0, sizeof(*bs));
        bs->n_tokens = take;
        bs->ctx_len = seq->n_cached;
        bs->tokens = seq->tokens + seq->n_cached;
        bs->block_table = seq->blocks;
        bs->n_logits = (seq->n_cached + take == seq->n_tokens) ? 1 : 0;
        engine->batch_index[n_batch] = i;
        if (lp_rows) {
            /* a row per position: the prompt's logprobs; the last
             * samples when the chunk ends the prompt */
            for (int r = 0; r < take - bs->n_logits; r++)
                engine->row_samplers[n_rows++] = NULL;
            if (bs->n_logits)
                engine->row_samplers[n_rows++] = seq->sampler;
            bs->n_logits = take;
            lp_b = n_batch;
        } else {
            if (bs->n_logits)
                engine->row_samplers[n_rows] = seq->sampler;
            n_rows += bs->n_logits;
        }
        n_batch++;
        left -= take;
    }
    if (n_batch == 0)
        return BT_OK;
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = n_batch;
    batch.seqs = engine->batch_seqs;
    /* sampled where the logits are (on the GPU for cuda): only ids come
     * back */
    status = backend_forward_sample(engine->backend, &batch,
                                    engine->row_samplers, engine->row_ids,
                                    lp_used ? engine->lp_logits : NULL,
                                    NULL);
    if (status != BT_OK)
        return status;

    for (int b = 0, row = 0; b < n_batch; b++) {
        engine_seq_t *seq = seqs[engine->batch_index[b]];
        const backend_seq_t *bs = &engine->batch_seqs[b];
        int samples = seq->n_cached + bs->n_tokens == seq->n_tokens;
        int tok;

        if (b == lp_b) {
            /* rows of prompt positions (the sampled one excluded) */
            sampler_prompt_lp_rows(seq->plp,
                                   engine->lp_logits +
                                       (size_t)row * engine->vocab_size,
                                   engine->vocab_size, seq->tokens,
                                   seq->n_cached, bs->n_logits - samples);
            row += bs->n_logits - samples;
        }
        seq->n_cached += bs->n_tokens;
        if (!samples || bs->n_logits == 0)
            continue;
        tok = engine->row_ids[row++];
        if (seq->grammar != NULL) {
            status = grammar_advance_token(seq->grammar, &seq->gstate, tok);
            if (status != BT_OK)
                return BT_ERROR(BT_ERR_INTERNAL, "ENGINE",
                                "sampled token %d outside the grammar's "
                                "mask", tok);
        }
        sampler_observe(seq->sampler, tok);
        BT_ASSERT(seq->n_tokens < seq->cap);
        seq->tokens[seq->n_tokens++] = tok;
        sampled[engine->batch_index[b]] = tok;
    }
    return BT_OK;
}

// ----------------------------------------------------------------------------
// speculative decoding support

const engine_config_t *engine_config(const engine_t *engine)
{
    return &engine->cfg;
}

const int *engine_seq_blocks(const engine_seq_t *seq, int *n_blocks_p)
{
    *n_blocks_p = seq->n_blocks;
    return seq->blocks;
}

sampler_t *engine_seq_sampler(engine_seq_t *seq)
{
    return seq->sampler;
}

bt_status_t engine_seq_reserve(engine_t *engine, engine_seq_t *seq,
                               int n_slots)
{
    int want;
    bt_status_t status;

    if (n_slots < 0 || n_slots > engine->max_context)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "%d KV slots exceed the context of %d", n_slots,
                        engine->max_context);
    want = (int)BT_DIV_UP(n_slots, engine->block_size);
    if (want <= seq->n_blocks)
        return BT_OK;
    status = kv_allocator_alloc(engine->kv, want - seq->n_blocks,
                                seq->blocks + seq->n_blocks);
    if (status != BT_OK)
        return BT_ERROR(BT_ERR_NO_RESOURCE, "KV",
                        "KV pool full: need %d blocks, %d free",
                        want - seq->n_blocks,
                        kv_allocator_free_count(engine->kv));
    seq->n_blocks = want;
    return BT_OK;
}

bt_status_t engine_seq_commit(engine_t *engine, engine_seq_t *seq,
                              const int *tokens, int n, int n_cached)
{
    if (n < 0 || seq->n_tokens + n > seq->cap)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "%d more tokens exceed the context", n);
    if (n_cached < seq->n_cached || n_cached > seq->n_tokens + n ||
        n_cached > seq->n_blocks * engine->block_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "cached count %d out of range", n_cached);
    if (seq->grammar != NULL) {
        /* all or nothing: the tokens must fit the grammar */
        grammar_state_t st = seq->gstate;
        for (int i = 0; i < n; i++) {
            bt_status_t status;
            if (seq->n_tokens + i < seq->g_start)
                continue;
            status = grammar_advance_token(seq->grammar, &st, tokens[i]);
            if (status != BT_OK)
                return BT_ERROR(status, "ENGINE", "committed token %d (id "
                                "%d) does not fit the grammar", i,
                                tokens[i]);
        }
        seq->gstate = st;
    }
    for (int i = 0; i < n; i++) {
        sampler_observe(seq->sampler, tokens[i]);
        seq->tokens[seq->n_tokens++] = tokens[i];
    }
    seq->n_cached = n_cached;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// structured output

bt_status_t engine_grammar_vocab(engine_t *engine,
                                 const grammar_vocab_t **vocab_p)
{
    const model_config_t *mcfg = model_config(engine->model);
    bt_status_t status;

    if (engine->gvocab == NULL) {
        if (engine->tok == NULL)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "structured output needs a tokenizer");
        status = grammar_vocab_create(engine->tok, engine->vocab_size,
                                      mcfg->eos_ids, mcfg->n_eos,
                                      &engine->gvocab);
        if (status != BT_OK)
            return status;
    }
    *vocab_p = engine->gvocab;
    return BT_OK;
}

bt_status_t engine_seq_set_grammar(engine_t *engine, engine_seq_t *seq,
                                   grammar_t *grammar, int start)
{
    const grammar_vocab_t *vocab;
    grammar_state_t st;
    uint64_t *mask;
    bt_status_t status;

    if (start < 0)
        start = seq->n_prompt;
    if (start > seq->n_tokens)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "grammar start %d beyond the sequence's %d tokens",
                        start, seq->n_tokens);
    status = engine_grammar_vocab(engine, &vocab);
    if (status != BT_OK)
        return status;
    if (grammar_vocab_size(vocab) != engine->vocab_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE", "grammar vocabulary "
                        "of %d tokens, model of %d",
                        grammar_vocab_size(vocab), engine->vocab_size);
    /* the tokens already generated (a request taken over mid-stream) */
    status = grammar_replay(grammar, seq->tokens + start,
                            seq->n_tokens - start, &st);
    if (status != BT_OK)
        return status;
    mask = bt_malloc(sizeof(uint64_t) * grammar_mask_words(vocab),
                     "engine_grammar");
    if (mask == NULL)
        return BT_ERR_NO_MEMORY;
    bt_free(seq->gmask);
    seq->gmask = mask;
    seq->grammar = grammar;
    seq->gstate = st;
    seq->g_start = start;
    sampler_set_mask(seq->sampler, mask);
    /* until the first step writes it: everything (never read before) */
    memset(mask, 0xff, sizeof(uint64_t) * grammar_mask_words(vocab));
    return BT_OK;
}

bool engine_seq_has_grammar(const engine_seq_t *seq)
{
    return seq->grammar != NULL;
}

bool engine_seq_grammar_final(const engine_seq_t *seq)
{
    return seq->grammar != NULL &&
           grammar_is_accepting(seq->grammar, seq->gstate) &&
           grammar_is_final(seq->grammar, seq->gstate);
}

bt_status_t engine_seq_adopt_kv(engine_t *engine, engine_seq_t *seq,
                                const int *blocks, int n_blocks,
                                int n_cached)
{
    if (seq->n_blocks != 0 || n_blocks < 0 || n_blocks > seq->max_blocks ||
        n_cached < 0 || n_cached > seq->n_tokens ||
        n_cached > n_blocks * engine->block_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "cannot adopt %d blocks for %d cached tokens",
                        n_blocks, n_cached);
    memcpy(seq->blocks, blocks, sizeof(int) * (size_t)n_blocks);
    seq->n_blocks = n_blocks;
    seq->n_cached = n_cached;
    return BT_OK;
}

// ---------------------------------------------------------------------------
// Warm-up

/* One warm-up forward: n_seqs sequences of n_tokens new tokens each
 * (token id 1, fresh KV blocks), greedy samplers on the logits rows.
 * False when the pool cannot hold it (skipped). */
static bt_status_t engine_warm_step(engine_t *engine, int n_seqs,
                                    int n_tokens, sampler_t *greedy,
                                    bool *ran_p)
{
    int bs = engine->block_size;
    int per = BT_DIV_UP(n_tokens, bs);
    int n_blocks = per * n_seqs;
    int *blocks = NULL, *tokens = NULL, *ids = NULL;
    sampler_t **samp = NULL;
    backend_seq_t *seqs = NULL;
    backend_batch_t batch;
    bt_status_t status = BT_OK;

    *ran_p = false;
    if (n_seqs > engine->cfg.backend.max_seqs ||
        (long)n_seqs * n_tokens > engine->cfg.backend.max_batch_tokens ||
        n_tokens > engine->max_context ||
        kv_allocator_free_count(engine->kv) < n_blocks)
        return BT_OK;
    blocks = bt_malloc((size_t)n_blocks * sizeof(int), "engine_warmup");
    tokens = bt_malloc((size_t)n_tokens * sizeof(int), "engine_warmup");
    ids = bt_malloc((size_t)n_seqs * sizeof(int), "engine_warmup");
    samp = bt_malloc((size_t)n_seqs * sizeof(*samp), "engine_warmup");
    seqs = bt_calloc((size_t)n_seqs, sizeof(*seqs), "engine_warmup");
    if (blocks == NULL || tokens == NULL || ids == NULL || samp == NULL ||
        seqs == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    status = kv_allocator_alloc(engine->kv, n_blocks, blocks);
    if (status != BT_OK)
        goto out;
    for (int i = 0; i < n_tokens; i++)
        tokens[i] = 1 % engine->vocab_size;
    for (int s = 0; s < n_seqs; s++) {
        seqs[s].n_tokens = n_tokens;
        seqs[s].ctx_len = 0;
        seqs[s].tokens = tokens;
        seqs[s].block_table = blocks + (size_t)s * per;
        seqs[s].n_logits = 1;
        samp[s] = greedy;
    }
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = n_seqs;
    batch.seqs = seqs;
    status = backend_forward_sample(engine->backend, &batch, samp, ids, NULL,
                                    NULL);
    kv_allocator_release(engine->kv, n_blocks, blocks);
    *ran_p = status == BT_OK;
out:
    bt_free(blocks);
    bt_free(tokens);
    bt_free(ids);
    bt_free(samp);
    bt_free(seqs);
    return status;
}

bt_status_t engine_warmup(engine_t *engine, int chunk_tokens,
                          int batch_tokens, bool decode)
{
    const int max_seqs = engine->cfg.backend.max_seqs;
    int prompts[3] = { 16, chunk_tokens, batch_tokens };
    int n_prompts = 0, n_decode = 0, largest = 0;
    uint64_t t0 = bt_time_ns();
    sampler_params_t sp;
    sampler_t *greedy = NULL;
    bt_status_t status;

    sampler_params_init(&sp); /* greedy */
    status = sampler_create(&sp, engine->vocab_size, &greedy);
    if (status != BT_OK)
        return status;
    /* prompts first: uncaptured, so the GEMMs are tuned before any
     * decode graph is captured with them */
    for (int i = 0; i < 3 && status == BT_OK; i++) {
        bool ran;

        if (prompts[i] <= 0 || (i == 2 && prompts[2] == prompts[1]))
            continue;
        status = engine_warm_step(engine, 1,
                                  BT_MIN(prompts[i], engine->max_context),
                                  greedy, &ran);
        n_prompts += ran;
    }
    for (int n = 1; decode && status == BT_OK; n *= 2) {
        bool ran;

        n = BT_MIN(n, max_seqs);
        status = engine_warm_step(engine, n, 1, greedy, &ran);
        if (ran) {
            n_decode++;
            largest = n;
        }
        if (n == max_seqs)
            break;
    }
    sampler_destroy(&greedy);
    if (status != BT_OK)
        return status;
    BT_LOG_INFO("ENGINE", "warm-up done in %.2f s: %d prompt shapes (16, "
                "%d, %d tokens), %d decode batch sizes up to %d sequences "
                "(of %d)", (double)(bt_time_ns() - t0) * 1e-9, n_prompts,
                chunk_tokens, batch_tokens, n_decode, largest, max_seqs);
    {
        size_t free_b, total_b;

        if (backend_mem_info(engine->backend, &free_b, &total_b) == BT_OK)
            BT_LOG_INFO("ENGINE", "device memory after the warm-up: %zu "
                        "MiB free of %zu MiB (graphs, tuning and sampling "
                        "came out of the KV fraction's remainder)",
                        free_b >> 20, total_b >> 20);
    }
    return BT_OK;
}
