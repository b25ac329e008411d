/*
 * test_tokenizer_identity.c - tok_identity (issue 38: a router with
 * --tokenizer sends a worker ids only when their identities are equal):
 * one file loaded twice, through tok_load or tok_load_llama2c or from
 * memory, has one identity; another file, or the same file with one byte
 * changed (a merge score: other ids for some text), has another.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/tokenizer.h"

static uint64_t identity_of(const char *path)
{
    tok_t *tok = NULL;
    uint64_t id;

    BT_ASSERT_OK(tok_load(path, 0, &tok));
    id = tok_identity(tok);
    tok_destroy(&tok);
    BT_CHECK(id != 0);
    return id;
}

int main(void)
{
    char aid[512], llama[512];
    char *data = NULL;
    size_t len = 0;
    tok_t *tok = NULL;
    uint64_t a;

    snprintf(aid, sizeof(aid), "%s/models/aidreams-tok512.bin",
             BT_SHARED_DIR);
    snprintf(llama, sizeof(llama), "%s/models/llama2-tokenizer.bin",
             BT_SHARED_DIR);
    a = identity_of(aid);
    BT_ASSERT_EQ(identity_of(aid), a);
    BT_CHECK(identity_of(llama) != a);
    BT_ASSERT_OK(tok_load_llama2c(aid, 512, &tok));
    BT_ASSERT_EQ(tok_identity(tok), a);
    tok_destroy(&tok);

    BT_ASSERT_OK(bt_read_file(aid, 1 << 20, &data, &len));
    BT_ASSERT_OK(tok_load_llama2c_mem(data, len, 512, &tok));
    BT_ASSERT_EQ(tok_identity(tok), a);
    tok_destroy(&tok);
    data[4] ^= 0x40; /* piece 0's merge score, after the header */
    BT_ASSERT_OK(tok_load_llama2c_mem(data, len, 512, &tok));
    BT_CHECK(tok_identity(tok) != a);
    tok_destroy(&tok);
    bt_free(data);
    BT_ASSERT_EQ(tok_identity(NULL), 0);
    BT_TEST_PASS("tokenizer/identity: one file, one identity; any byte "
                 "changes it");
    return 0;
}
