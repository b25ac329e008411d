/*
 * test_golden.c - every line of ../shared/models/golden.jsonl reproduced
 * exactly through the real `baton run` binary: aidreams from its prompt
 * text (through the tokenizer), stories260K from --prompt-ids, and both
 * again from their Hugging Face conversions (ids only; the HF directories
 * name EOS 2 while the golden lines stop only at BOS, so the run stops at
 * id 1 alone, as the models README says).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"

/* Runs cmd, returns its stdout (caller frees) and exit status. */
static char *run_cmd(const char *cmd, int *exit_p)
{
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);

    BT_CHECK(f != NULL && out != NULL);
    while (!feof(f) && n + 1 < cap)
        n += fread(out + n, 1, cap - 1 - n, f);
    out[n] = '\0';
    *exit_p = pclose(f);
    return out;
}

static void append_ids(char *buf, size_t cap, const cJSON *arr)
{
    const cJSON *it;
    size_t n = strlen(buf);

    cJSON_ArrayForEach(it, arr) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? " " : "",
                              it->valueint);
    }
}

static void check_line(const char *label, const char *cmd,
                       const cJSON *expect)
{
    char want[8192] = "";
    char *got;
    int status;
    size_t len;

    append_ids(want, sizeof(want), expect);
    got = run_cmd(cmd, &status);
    len = strlen(got);
    while (len > 0 && (got[len - 1] == '\n' || got[len - 1] == ' '))
        got[--len] = '\0';
    if (status != 0)
        BT_TEST_FAIL("%s: command failed (%d): %s", label, status, cmd);
    if (strcmp(got, want) != 0)
        BT_TEST_FAIL("%s: ids differ\n  cmd:  %s\n  want: %s\n  got:  %s",
                     label, cmd, want, got);
    fprintf(stderr, "ok %s (%d ids)\n", label, cJSON_GetArraySize(expect));
    free(got);
}

int main(void)
{
    char *data, *line, *save = NULL;
    size_t len;
    int n_lines = 0;
    const char *shared = BT_SHARED_DIR "/models";

    BT_ASSERT_OK(bt_read_file(BT_SHARED_DIR "/models/golden.jsonl", 1 << 20,
                              &data, &len));
    for (line = strtok_r(data, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const char *model, *hf;
        const cJSON *prompt, *prompt_ids, *greedy;
        int steps, max_tokens;
        char ids[4096] = "", cmd[12288], label[128];

        BT_CHECK(j != NULL);
        model = cJSON_GetObjectItem(j, "model")->valuestring;
        prompt = cJSON_GetObjectItem(j, "prompt");
        prompt_ids = cJSON_GetObjectItem(j, "prompt_ids");
        greedy = cJSON_GetObjectItem(j, "greedy_ids");
        steps = cJSON_GetObjectItem(j, "steps")->valueint;
        max_tokens = steps - cJSON_GetArraySize(prompt_ids) + 1;
        append_ids(ids, sizeof(ids), prompt_ids);
        hf = strstr(model, "aidreams") ? "aidreams260K-hf" : "stories260K-hf";

        if (prompt != NULL && cJSON_IsString(prompt)) {
            const cJSON *tok = cJSON_GetObjectItem(j, "tokenizer");
            snprintf(cmd, sizeof(cmd),
                     "%s/baton run --model %s/%s --tokenizer %s/%s "
                     "--prompt '%s' --max-tokens %d --ids --threads 1",
                     BT_BIN_DIR, shared, model, shared, tok->valuestring,
                     prompt->valuestring, max_tokens);
            snprintf(label, sizeof(label), "%s text #%d", model, n_lines);
            check_line(label, cmd, greedy);
        }
        snprintf(cmd, sizeof(cmd),
                 "%s/baton run --model %s/%s --prompt-ids '%s' "
                 "--max-tokens %d --ids --block-size 8",
                 BT_BIN_DIR, shared, model, ids, max_tokens);
        snprintf(label, sizeof(label), "%s ids #%d", model, n_lines);
        check_line(label, cmd, greedy);
        snprintf(cmd, sizeof(cmd),
                 "%s/baton run --model %s/%s --prompt-ids '%s' "
                 "--max-tokens %d --ids --ignore-eos --stop-id 1",
                 BT_BIN_DIR, shared, hf, ids, max_tokens);
        snprintf(label, sizeof(label), "%s ids #%d", hf, n_lines);
        check_line(label, cmd, greedy);
        cJSON_Delete(j);
        n_lines++;
    }
    bt_free(data);
    BT_CHECK(n_lines >= 10);
    fprintf(stderr, "%d golden lines reproduced\n", n_lines);
    BT_TEST_PASS("cli/golden");
    return 0;
}
