/*
 * test_bad_input.c - every malformed model input is refused with a clear
 * error naming the problem, never a crash: truncated or inconsistent
 * llama2.c files, broken safetensors headers, wrong or missing tensors,
 * unknown dtypes and architectures, broken config.json and index.json.
 * Also the config.json variants a loader must read (nested rope_theta,
 * rope scaling, eos lists, generation_config overrides) and a sharded
 * directory.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model_test_util.h"

static char tmp[256];
static bool no_pad; /* make_hf_dir leaves the header unpadded */
static char aid_bin[1024], aid_cfg[1100], aid_st[1100];

/* Loads `path`, expects `status` and every needle in the message. */
static void expect_fail(const char *path, bt_status_t status,
                        const char *n1, const char *n2, const char *n3)
{
    model_t *m = NULL;
    bt_status_t got;

    bt_error_clear();
    got = model_load(path, &m);
    if (got != status)
        BT_TEST_FAIL("%s: status %d, expected %d (%s)", path, (int)got,
                     (int)status, bt_error_last());
    BT_CHECK(m == NULL);
    if ((n1 && !strstr(bt_error_last(), n1)) ||
        (n2 && !strstr(bt_error_last(), n2)) ||
        (n3 && !strstr(bt_error_last(), n3)))
        BT_TEST_FAIL("%s: message \"%s\" lacks \"%s\" / \"%s\" / \"%s\"",
                     path, bt_error_last(), n1, n2 ? n2 : "", n3 ? n3 : "");
}

// ----------------------------------------------------------------------------
// llama2.c

static void bad_llama2c(void)
{
    char path[512];
    size_t n;
    char *data = mt_read(aid_bin, &n);
    int32_t h[7];
    static const size_t cuts[] = { 0, 3, 27, 28, 100, 131100, 400000 };

    snprintf(path, sizeof(path), "%s/bad.bin", tmp);
    for (size_t i = 0; i < BT_ARRAY_SIZE(cuts); i++) {
        mt_write(path, data, cuts[i]);
        expect_fail(path, BT_ERR_FORMAT, "truncated", NULL, NULL);
    }
    mt_write(path, data, 100);
    expect_fail(path, BT_ERR_FORMAT, "token_embedding truncated", NULL, NULL);
    mt_write(path, data, n - 4);
    expect_fail(path, BT_ERR_FORMAT, "freq_cis_imag truncated",
                "file has 932120 bytes", "needs 932124");
    mt_write(path, data, n - 1);
    expect_fail(path, BT_ERR_FORMAT, "truncated", NULL, NULL);

    /* a negative vocab_size promises a separate classifier that is absent */
    memcpy(h, data, sizeof(h));
    h[5] = -512;
    memcpy(data, h, sizeof(h));
    mt_write(path, data, n);
    expect_fail(path, BT_ERR_FORMAT, "wcls truncated: file has 932124 bytes",
                "needs 1063196", NULL);

    /* trailing bytes */
    h[5] = 512;
    memcpy(data, h, sizeof(h));
    {
        char *big = bt_malloc(n + 8, "test");
        memcpy(big, data, n);
        memset(big + n, 0, 8);
        mt_write(path, big, n + 8);
        bt_free(big);
        expect_fail(path, BT_ERR_FORMAT, "header implies", NULL, NULL);
    }

    /* header values */
    {
        static const struct {
            int field;
            int32_t value;
            const char *needle;
        } cases[] = {
            { 0, 0, "dim = 0" },
            { 0, -64, "dim = -64" },
            { 0, 1 << 30, "out of range" },
            { 1, 0, "hidden_dim = 0" },
            { 2, 0, "n_layers = 0" },
            { 2, 100000, "n_layers = 100000" },
            { 3, -4, "n_heads = -4" },
            { 3, 5, "n_heads 5 does not divide dim 64" },
            { 4, 3, "n_kv_heads 3 does not divide n_heads 4" },
            { 4, 8, "n_kv_heads 8 does not divide" },
            { 5, 0, "vocab_size = 0" },
            { 5, INT32_MIN, "vocab_size" },
            { 5, 1 << 30, "vocab_size" },
            { 6, 0, "seq_len = 0" },
            { 6, INT32_MAX, "seq_len" },
            { 3, 64, "head_dim = 1" },
        };
        for (size_t i = 0; i < BT_ARRAY_SIZE(cases); i++) {
            int32_t hh[7];
            memcpy(hh, h, sizeof(hh));
            hh[cases[i].field] = cases[i].value;
            if (cases[i].field == 3 && cases[i].value == 64)
                hh[4] = 64;
            memcpy(data, hh, sizeof(hh));
            mt_write(path, data, n);
            expect_fail(path, BT_ERR_FORMAT, cases[i].needle, NULL, NULL);
        }
    }
    bt_free(data);
    expect_fail("/nonexistent/x.bin", BT_ERR_IO, "/nonexistent/x.bin", NULL,
                NULL);
}

// ----------------------------------------------------------------------------
// safetensors from memory

static bt_status_t st_mem(const char *json, size_t data_len)
{
    size_t hl = strlen(json), n = 8 + hl + data_len;
    uint8_t *buf = bt_calloc(1, n + 8, "test");
    model_st_file_t st;
    bt_status_t status;

    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    memset(&st, 0, sizeof(st));
    bt_error_clear();
    status = model_st_parse(buf, n, "mem", &st);
    model_st_cleanup(&st);
    bt_free(buf);
    return status;
}

static void expect_st(const char *json, size_t data_len, bt_status_t status,
                      const char *needle)
{
    bt_status_t got = st_mem(json, data_len);
    if (got != status || (needle && !strstr(bt_error_last(), needle)))
        BT_TEST_FAIL("%s: status %d (%s), expected %d \"%s\"", json, (int)got,
                     bt_error_last(), (int)status, needle ? needle : "");
}

static void bad_safetensors_mem(void)
{
    uint8_t buf[64];
    model_st_file_t st;

    /* valid */
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
              "\"data_offsets\":[0,16]},\"__metadata__\":{\"x\":\"y\"}}", 16,
              BT_OK, NULL);
    expect_st("{}", 0, BT_OK, NULL);
    /* header length beyond the file */
    memset(buf, 0, sizeof(buf));
    buf[0] = 100;
    BT_ASSERT_EQ(model_st_parse(buf, 40, "mem", &st), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "beyond the file") != NULL);
    buf[0] = 0;
    buf[7] = 0x80; /* 2^63 */
    BT_ASSERT_EQ(model_st_parse(buf, 40, "mem", &st), BT_ERR_FORMAT);
    BT_ASSERT_EQ(model_st_parse(buf, 5, "mem", &st), BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "too short") != NULL);
    /* not JSON, not an object */
    expect_st("this is not json", 0, BT_ERR_FORMAT, "not a JSON object");
    expect_st("[1,2,3]", 0, BT_ERR_FORMAT, "not a JSON object");
    expect_st("{\"a\":{\"dtype\":\"F32\"", 0, BT_ERR_FORMAT,
              "not a JSON object");
    /* entry problems */
    expect_st("{\"a\":5}", 0, BT_ERR_FORMAT, "tensor a");
    expect_st("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              BT_ERR_FORMAT, "dtype");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
              BT_ERR_FORMAT, "shape");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],"
              "\"data_offsets\":[0,4]}}", 4, BT_ERR_FORMAT, "bad dimension");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],"
              "\"data_offsets\":[0,4]}}", 4, BT_ERR_FORMAT, "bad dimension");
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, BT_ERR_FORMAT,
              "data_offsets");
    /* data_offsets out of range, reversed, negative, mismatched */
    expect_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],"
              "\"data_offsets\":[0,16]}}", 8, BT_ERR_FORMAT,
              "outside the data area");
    expect_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],"
              "\"data_offsets\":[8,4]}}", 8, BT_ERR_FORMAT,
              "outside the data area");
    expect_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
              "\"data_offsets\":[-8,-4]}}", 8, BT_ERR_FORMAT,
              "non-negative");
    expect_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],"
              "\"data_offsets\":[0,8]}}", 16, BT_ERR_FORMAT,
              "needs 12 bytes");
    expect_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,"
              "4294967296],\"data_offsets\":[0,8]}}", 16, BT_ERR_FORMAT,
              "overflows");
    /* overlapping tensors */
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
              "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
              "\"data_offsets\":[4,12]}}", 16, BT_ERR_FORMAT, "overlap");
    /* misaligned f32 parses (the loader copies it) */
    expect_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
              "\"data_offsets\":[2,6]}}", 8, BT_OK, NULL);
    /* duplicate names */
    expect_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
              "\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
              "\"data_offsets\":[1,2]}}", 8, BT_ERR_FORMAT, "twice");
    /* unknown dtypes parse (refused only when the loader needs them) */
    expect_st("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[7],"
              "\"data_offsets\":[0,3]}}", 8, BT_OK, NULL);
}

// ----------------------------------------------------------------------------
// Hugging Face directories

/* Copies the shared aidreams safetensors with one substitution in its
 * JSON header (re-padded), and the shared config, into dir. */
static void make_hf_dir(const char *dir, const char *old, const char *new_,
                        const char *st_name)
{
    char path[600];
    size_t n, cn;
    char *data = mt_read(aid_st, &n), *cfg = mt_read(aid_cfg, &cn);
    uint64_t hl = 0;
    char *hdr, *pos, *out;
    size_t nl, ol;

    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    mt_write(path, cfg, cn);
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (uint8_t)data[i];
    hdr = bt_malloc(hl + strlen(new_) + 16, "test");
    memcpy(hdr, data + 8, hl);
    hdr[hl] = '\0';
    while (hl > 0 && hdr[hl - 1] == ' ')
        hdr[--hl] = '\0';
    if (old != NULL) {
        pos = strstr(hdr, old);
        BT_CHECK(pos != NULL);
        ol = strlen(old);
        memmove(pos + strlen(new_), pos + ol, hl - (size_t)(pos - hdr) - ol + 1);
        memcpy(pos, new_, strlen(new_));
        hl = strlen(hdr);
    }
    while (hl % 8 != 0 && !no_pad)
        hdr[hl++] = ' ';
    nl = n - 8 - (size_t)strlen(data + 8 > data ? "" : "");
    {
        uint64_t old_hl = 0;
        for (int i = 7; i >= 0; i--)
            old_hl = (old_hl << 8) | (uint8_t)data[i];
        nl = n - 8 - (size_t)old_hl; /* data area bytes */
        out = bt_malloc(8 + hl + nl, "test");
        for (int i = 0; i < 8; i++)
            out[i] = (char)(uint8_t)(hl >> (8 * i));
        memcpy(out + 8, hdr, hl);
        memcpy(out + 8 + hl, data + 8 + old_hl, nl);
    }
    snprintf(path, sizeof(path), "%s/%s", dir, st_name);
    mt_write(path, out, 8 + hl + nl);
    bt_free(out);
    bt_free(hdr);
    bt_free(cfg);
    bt_free(data);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    mt_write(path, text, strlen(text));
}

/* Replaces `old` by `new_` in the shared config.json, written to dir. */
static void edit_config(const char *dir, const char *old, const char *new_)
{
    size_t n;
    char *cfg = mt_read(aid_cfg, &n);
    char *out = bt_malloc(n + strlen(new_) + 1, "test");
    char *pos = strstr(cfg, old);

    BT_CHECK(pos != NULL);
    memcpy(out, cfg, (size_t)(pos - cfg));
    strcpy(out + (pos - cfg), new_);
    strcat(out, pos + strlen(old));
    write_text(dir, "config.json", out);
    bt_free(out);
    bt_free(cfg);
}

static void bad_hf(void)
{
    char dir[512], st[600];
    model_t *m = NULL, *ref = NULL;

    snprintf(dir, sizeof(dir), "%s/hf", tmp);
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);

    /* the unmodified copy loads */
    make_hf_dir(dir, NULL, "", "model.safetensors");
    BT_ASSERT_OK(model_load(dir, &m));
    model_destroy(&m);

    /* wrong shape: names the tensor and both shapes */
    make_hf_dir(dir, "\"model.layers.1.mlp.up_proj.weight\":{\"dtype\":\"F32\","
                     "\"shape\":[172,64]",
                "\"model.layers.1.mlp.up_proj.weight\":{\"dtype\":\"F32\","
                "\"shape\":[64,172]", "model.safetensors");
    expect_fail(dir, BT_ERR_FORMAT, "model.layers.1.mlp.up_proj.weight",
                "[64, 172]", "[172, 64]");
    make_hf_dir(dir, "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64]",
                "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8,8]",
                "model.safetensors");
    expect_fail(dir, BT_ERR_FORMAT, "model.norm.weight", "[8, 8]", "[64]");
    /* missing tensor */
    make_hf_dir(dir, "\"model.norm.weight\"", "\"model.norm.weigh_\"",
                "model.safetensors");
    expect_fail(dir, BT_ERR_FORMAT, "missing tensor model.norm.weight", NULL,
                NULL);
    /* unknown dtype */
    make_hf_dir(dir, "\"model.norm.weight\":{\"dtype\":\"F32\"",
                "\"model.norm.weight\":{\"dtype\":\"I32\"",
                "model.safetensors");
    expect_fail(dir, BT_ERR_UNSUPPORTED, "model.norm.weight", "I32", NULL);
    /* data_offsets beyond the data area */
    make_hf_dir(dir, "[923648,923904]", "[923648,923908]",
                "model.safetensors");
    expect_fail(dir, BT_ERR_FORMAT, "model.norm.weight", "outside", NULL);
    /* header length beyond the file; non-JSON header */
    {
        uint8_t junk[64];
        memset(junk, 'x', sizeof(junk));
        junk[0] = 0xff;
        junk[1] = 0xff;
        memset(junk + 2, 0, 6);
        mt_write(st, junk, sizeof(junk));
        expect_fail(dir, BT_ERR_FORMAT, "beyond the file", NULL, NULL);
        junk[0] = 16;
        junk[1] = 0;
        mt_write(st, junk, sizeof(junk));
        expect_fail(dir, BT_ERR_FORMAT, "not a JSON object", NULL, NULL);
    }
    /* unused extra tensors are ignored */
    make_hf_dir(dir, "\"__metadata__\"",
                "\"model.layers.0.self_attn.rotary_emb.inv_freq\":"
                "{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[0,0]},"
                "\"__metadata__\"", "model.safetensors");
    BT_ASSERT_OK(model_load(dir, &m));
    model_destroy(&m);

    /* an unpadded header leaves f32 data unaligned: loaded via copies */
    no_pad = true;
    make_hf_dir(dir, "{\"__metadata__\":{\"format\":\"pt\"}",
                "{\"__metadata__\":{\"format\":\"pt12\"}",
                "model.safetensors");
    no_pad = false;
    BT_ASSERT_OK(model_load(dir, &m));
    BT_ASSERT_OK(model_load(aid_cfg, &ref));
    BT_CHECK((uintptr_t)model_tok_embedding(m)->data % 4 == 0);
    mt_same_weights(m, ref);
    model_destroy(&ref);
    model_destroy(&m);

    /* config.json problems */
    make_hf_dir(dir, NULL, "", "model.safetensors");
    edit_config(dir, "LlamaForCausalLM", "GPT2LMHeadModel");
    expect_fail(dir, BT_ERR_UNSUPPORTED, "GPT2LMHeadModel", NULL, NULL);
    edit_config(dir, "\"hidden_size\": 64,", "");
    expect_fail(dir, BT_ERR_FORMAT, "missing field hidden_size", NULL, NULL);
    edit_config(dir, "\"hidden_size\": 64", "\"hidden_size\": \"64\"");
    expect_fail(dir, BT_ERR_FORMAT, "hidden_size must be an integer", NULL,
                NULL);
    edit_config(dir, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 4.5");
    expect_fail(dir, BT_ERR_FORMAT, "num_hidden_layers", NULL, NULL);
    edit_config(dir, "\"tie_word_embeddings\": true",
                "\"tie_word_embeddings\": 1");
    expect_fail(dir, BT_ERR_FORMAT, "tie_word_embeddings", NULL, NULL);
    edit_config(dir, "\"num_key_value_heads\": 4",
                "\"num_key_value_heads\": 3");
    expect_fail(dir, BT_ERR_FORMAT, "n_kv_heads 3", NULL, NULL);
    edit_config(dir, "\"tie_word_embeddings\": true",
                "\"tie_word_embeddings\": false");
    expect_fail(dir, BT_ERR_FORMAT, "missing tensor lm_head.weight", NULL,
                NULL);
    edit_config(dir, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
    expect_fail(dir, BT_ERR_UNSUPPORTED, "yarn", NULL, NULL);
    edit_config(dir, "{", "[");
    expect_fail(dir, BT_ERR_FORMAT, "config.json", NULL, NULL);
    write_text(dir, "config.json", "");
    expect_fail(dir, BT_ERR_FORMAT, "config.json", NULL, NULL);
    write_text(dir, "generation_config.json", "{\"eos_token_id\": \"x\"}");
    edit_config(dir, "\"eos_token_id\": 2", "\"eos_token_id\": 2");
    expect_fail(dir, BT_ERR_FORMAT, "eos_token_id", NULL, NULL);
    write_text(dir, "generation_config.json", "{\"eos_token_id\": 9999}");
    expect_fail(dir, BT_ERR_FORMAT, "eos id 9999", NULL, NULL);
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [1, 2]}");
    BT_ASSERT_OK(model_load(dir, &m));
    BT_ASSERT_EQ(model_config(m)->n_eos, 2);
    model_destroy(&m);

    /* sharded: two shards, each tensor read from the one the index names */
    snprintf(dir, sizeof(dir), "%s/sharded", tmp);
    make_hf_dir(dir, NULL, "", "a.safetensors");
    make_hf_dir(dir, NULL, "", "b.safetensors");
    {
        char idx[8192];
        int off = snprintf(idx, sizeof(idx), "{\"metadata\": {}, "
                                             "\"weight_map\": {");
        static const char *const parts[] = {
            "input_layernorm.weight", "self_attn.q_proj.weight",
            "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        };
        off += snprintf(idx + off, sizeof(idx) - (size_t)off,
                        "\"model.embed_tokens.weight\": \"a.safetensors\", "
                        "\"model.norm.weight\": \"b.safetensors\"");
        for (int l = 0; l < 4; l++)
            for (size_t p = 0; p < BT_ARRAY_SIZE(parts); p++)
                off += snprintf(idx + off, sizeof(idx) - (size_t)off,
                                ", \"model.layers.%d.%s\": \"%s\"", l,
                                parts[p], l < 2 ? "a.safetensors"
                                                : "b.safetensors");
        snprintf(idx + off, sizeof(idx) - (size_t)off, "}}");
        write_text(dir, "model.safetensors.index.json", idx);
        BT_ASSERT_OK(model_load(dir, &m));
        BT_ASSERT_OK(model_load(aid_cfg, &ref));
        mt_same_weights(m, ref);
        model_destroy(&ref);
        model_destroy(&m);

        /* an index naming a missing shard */
        idx[strlen(idx) - 2] = '\0';
        strcat(idx, ", \"extra.weight\": \"c.safetensors\"}}");
        write_text(dir, "model.safetensors.index.json", idx);
        expect_fail(dir, BT_ERR_IO, "missing shard c.safetensors", NULL, NULL);
        write_text(dir, "model.safetensors.index.json",
                   "{\"weight_map\": {\"x\": \"../a.safetensors\"}}");
        expect_fail(dir, BT_ERR_FORMAT, "plain file name", NULL, NULL);
        write_text(dir, "model.safetensors.index.json", "{\"weight\": 1}");
        expect_fail(dir, BT_ERR_FORMAT, "weight_map", NULL, NULL);
    }
    /* a directory without weights */
    snprintf(dir, sizeof(dir), "%s/empty", tmp);
    mkdir(dir, 0755);
    write_text(dir, "config.json", "{}");
    expect_fail(dir, BT_ERR_FORMAT, "architectures", NULL, NULL);
    edit_config(dir, "\"vocab_size\": 512", "\"vocab_size\": 512");
    expect_fail(dir, BT_ERR_IO, "no model.safetensors", NULL, NULL);
}

// ----------------------------------------------------------------------------
// config.json variants

static void parse_cfg(const char *json, const char *gen, model_config_t *c,
                      bt_status_t expect)
{
    char arch[64];
    bt_status_t status = model_hf_config_parse(json, strlen(json), gen,
                                               gen ? strlen(gen) : 0, c, arch,
                                               sizeof(arch));
    if (status != expect)
        BT_TEST_FAIL("%s: status %d (%s), expected %d", json, (int)status,
                     bt_error_last(), (int)expect);
}

#define CFG_REST                                                            \
    "\"intermediate_size\": 14336, \"num_hidden_layers\": 32, "             \
    "\"vocab_size\": 128256, \"max_position_embeddings\": 131072"
#define CFG_BASE                                                            \
    "\"hidden_size\": 4096, \"num_attention_heads\": 32, " CFG_REST

static void config_variants(void)
{
    model_config_t c;

    /* defaults: kv heads = heads, head_dim = hidden/heads, theta 10000 */
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_BASE "}",
              NULL, &c, BT_OK);
    BT_ASSERT_EQ(c.n_kv_heads, 32);
    BT_ASSERT_EQ(c.head_dim, 128);
    BT_ASSERT_NEAR(c.rope_theta, 10000, 0);
    BT_ASSERT_EQ(c.rope_layout, MODEL_ROPE_HALF);
    BT_ASSERT_EQ(c.bos_id, -1);
    BT_ASSERT_EQ(c.n_eos, 0);
    BT_CHECK(!c.tied_embeddings && !c.qkv_bias);

    /* Llama 3.1: top-level theta, llama3 rope_scaling, eos list */
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_BASE ", "
              "\"num_key_value_heads\": 8, \"rope_theta\": 500000.0, "
              "\"rms_norm_eps\": 1e-05, \"bos_token_id\": 128000, "
              "\"eos_token_id\": [128001, 128008, 128009], "
              "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
              "\"high_freq_factor\": 4.0, "
              "\"original_max_position_embeddings\": 8192, "
              "\"rope_type\": \"llama3\"}}", NULL, &c, BT_OK);
    BT_ASSERT_EQ(c.n_kv_heads, 8);
    BT_ASSERT_NEAR(c.rope_theta, 500000, 0);
    BT_ASSERT_EQ(c.rope_scaling, MODEL_ROPE_SCALING_LLAMA3);
    BT_ASSERT_NEAR(c.rope_factor, 8, 0);
    BT_ASSERT_NEAR(c.rope_high_freq_factor, 4, 0);
    BT_ASSERT_EQ(c.rope_orig_max_pos, 8192);
    BT_ASSERT_EQ(c.bos_id, 128000);
    BT_ASSERT_EQ(c.n_eos, 3);
    BT_ASSERT_EQ(c.eos_ids[2], 128009);

    /* transformers 5: theta and scaling nested in rope_parameters;
     * generation_config overrides bos/eos */
    parse_cfg("{\"architectures\": [\"MistralForCausalLM\"], " CFG_BASE ", "
              "\"head_dim\": 64, \"eos_token_id\": 2, "
              "\"rope_parameters\": {\"rope_theta\": 1000000.0, "
              "\"rope_type\": \"linear\", \"factor\": 2.0}}",
              "{\"bos_token_id\": 5, \"eos_token_id\": [7, 9]}", &c, BT_OK);
    BT_ASSERT_EQ(c.head_dim, 64);
    BT_ASSERT_NEAR(c.rope_theta, 1000000, 0);
    BT_ASSERT_EQ(c.rope_scaling, MODEL_ROPE_SCALING_LINEAR);
    BT_ASSERT_NEAR(c.rope_factor, 2, 0);
    BT_ASSERT_EQ(c.bos_id, 5);
    BT_ASSERT_EQ(c.n_eos, 2);
    BT_ASSERT_EQ(c.eos_ids[1], 9);

    /* Qwen2 always has q/k/v biases; null rope_scaling is fine */
    parse_cfg("{\"architectures\": [\"Qwen2ForCausalLM\"], " CFG_BASE ", "
              "\"rope_scaling\": null, \"tie_word_embeddings\": true, "
              "\"bos_token_id\": null}", NULL, &c, BT_OK);
    BT_CHECK(c.qkv_bias && c.tied_embeddings);

    /* refusals */
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_BASE ", "
              "\"rope_scaling\": {\"rope_type\": \"linear\"}}", NULL, &c,
              BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "factor") != NULL);
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_BASE ", "
              "\"mlp_bias\": true}", NULL, &c, BT_ERR_UNSUPPORTED);
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_BASE ", "
              "\"rope_scaling\": 3}", NULL, &c, BT_ERR_FORMAT);
    parse_cfg("{\"architectures\": \"LlamaForCausalLM\", " CFG_BASE "}", NULL,
              &c, BT_ERR_FORMAT);
    parse_cfg("{\"architectures\": [], " CFG_BASE "}", NULL, &c,
              BT_ERR_FORMAT);
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_REST ", "
              "\"hidden_size\": 4096, \"num_attention_heads\": 0}", NULL,
              &c, BT_ERR_FORMAT);
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_REST ", "
              "\"hidden_size\": 4096, \"num_attention_heads\": 33}", NULL,
              &c, BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "divide") != NULL);
    parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " CFG_REST ", "
              "\"hidden_size\": 1e300, \"num_attention_heads\": 32}", NULL,
              &c, BT_ERR_FORMAT);
    BT_CHECK(strstr(bt_error_last(), "hidden_size") != NULL);
}

int main(void)
{
    bt_log_init("test");
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* errors are asserted instead */
    snprintf(aid_bin, sizeof(aid_bin), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(aid_cfg, sizeof(aid_cfg), "%s/models/aidreams260K-hf/config.json",
             BT_SHARED_DIR);
    snprintf(aid_st, sizeof(aid_st),
             "%s/models/aidreams260K-hf/model.safetensors", BT_SHARED_DIR);
    mt_mkdtemp(tmp, sizeof(tmp));
    bad_llama2c();
    bad_safetensors_mem();
    bad_hf();
    config_variants();
    mt_rmtree(tmp);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("model/bad_input");
    return 0;
}
