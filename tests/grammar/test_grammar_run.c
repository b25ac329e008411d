/*
 * test_grammar_run.c - `baton run` with structured output, end to end,
 * on the real aidreams260K model: --json-schema output parsed with cJSON
 * and checked by a small validator of the schema subset used here
 * (greedy and three seeds), --json-object, --regex checked with POSIX
 * regexec (an independent engine), --choice, and the refusals a user
 * sees (bad regex, unsupported keyword, two grammar options).
 */
#include <cJSON.h>
#include <regex.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_test.h"

#define MODELS BT_SHARED_DIR "/models"
#define RUN BT_BIN_DIR "/baton run --model " MODELS "/aidreams260K.bin " \
            "--tokenizer " MODELS "/aidreams-tok512.bin --prompt 'I dream' "

static const char schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":20},"
    "\"mood\":{\"enum\":[\"calm\",\"wild\",\"sad\"]},"
    "\"count\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":250},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"maxLength\":8},\"maxItems\":3},"
    "\"dream\":{\"type\":\"boolean\"},"
    "\"note\":{\"type\":\"string\",\"maxLength\":5}},"
    "\"required\":[\"name\",\"mood\",\"count\",\"tags\",\"dream\"],"
    "\"additionalProperties\":false}";

/* Runs cmd, returns its exit status; stdout (trailing newline removed)
 * into out, stderr into err. */
static int run(const char *args, char *out, size_t cap, char *err,
               size_t err_cap)
{
    char cmd[4096], errfile[] = "/tmp/bt_grammar_run_XXXXXX";
    int fd = mkstemp(errfile), st;
    FILE *p, *f;
    size_t n;

    BT_CHECK(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof(cmd), "timeout 60 %s %s 2>%s", RUN, args, errfile);
    p = popen(cmd, "r");
    BT_CHECK(p != NULL);
    n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    while (n > 0 && out[n - 1] == '\n')
        out[--n] = '\0';
    st = pclose(p);
    f = fopen(errfile, "r");
    n = f != NULL ? fread(err, 1, err_cap - 1, f) : 0;
    err[n] = '\0';
    if (f != NULL)
        fclose(f);
    unlink(errfile);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A validator for the keywords the schema above uses. */
static bool validate(const cJSON *v, const cJSON *s, char *why, size_t cap)
{
    const cJSON *type = cJSON_GetObjectItem(s, "type");
    const cJSON *en = cJSON_GetObjectItem(s, "enum");
    const cJSON *it;

    if (en != NULL) {
        cJSON_ArrayForEach(it, en)
            if (cJSON_Compare(it, v, true))
                return true;
        snprintf(why, cap, "value not in enum");
        return false;
    }
    if (strcmp(type->valuestring, "object") == 0) {
        const cJSON *props = cJSON_GetObjectItem(s, "properties");
        if (!cJSON_IsObject(v)) {
            snprintf(why, cap, "not an object");
            return false;
        }
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(s, "required"))
            if (!cJSON_HasObjectItem(v, it->valuestring)) {
                snprintf(why, cap, "missing %s", it->valuestring);
                return false;
            }
        cJSON_ArrayForEach(it, v) {
            const cJSON *ps = cJSON_GetObjectItem(props, it->string);
            if (ps == NULL) {
                snprintf(why, cap, "extra property %s", it->string);
                return false;
            }
            if (!validate(it, ps, why, cap))
                return false;
        }
        return true;
    }
    if (strcmp(type->valuestring, "array") == 0) {
        const cJSON *mx = cJSON_GetObjectItem(s, "maxItems");
        if (!cJSON_IsArray(v) ||
            (mx != NULL && cJSON_GetArraySize(v) > mx->valueint)) {
            snprintf(why, cap, "not an array of at most maxItems");
            return false;
        }
        cJSON_ArrayForEach(it, v)
            if (!validate(it, cJSON_GetObjectItem(s, "items"), why, cap))
                return false;
        return true;
    }
    if (strcmp(type->valuestring, "string") == 0) {
        const cJSON *mx = cJSON_GetObjectItem(s, "maxLength");
        size_t chars = 0;
        if (!cJSON_IsString(v)) {
            snprintf(why, cap, "not a string");
            return false;
        }
        for (const char *c = v->valuestring; *c; c++)
            chars += ((uint8_t)*c & 0xC0) != 0x80;
        if (mx != NULL && chars > (size_t)mx->valueint) {
            snprintf(why, cap, "string longer than maxLength");
            return false;
        }
        return true;
    }
    if (strcmp(type->valuestring, "integer") == 0) {
        const cJSON *lo = cJSON_GetObjectItem(s, "minimum");
        const cJSON *hi = cJSON_GetObjectItem(s, "maximum");
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)
                                                        v->valuedouble) {
            snprintf(why, cap, "not an integer");
            return false;
        }
        if ((lo != NULL && v->valuedouble < lo->valuedouble) ||
            (hi != NULL && v->valuedouble > hi->valuedouble)) {
            snprintf(why, cap, "integer outside [minimum, maximum]");
            return false;
        }
        return true;
    }
    if (strcmp(type->valuestring, "boolean") == 0)
        return cJSON_IsBool(v) || (snprintf(why, cap, "not a bool"), false);
    snprintf(why, cap, "validator does not know %s", type->valuestring);
    return false;
}

static void test_schema(void)
{
    char path[] = "/tmp/bt_grammar_schema_XXXXXX", args[512], out[8192];
    char err[4096], why[128];
    int fd = mkstemp(path);
    cJSON *s = cJSON_Parse(schema);
    static const char *const modes[] = {
        "", "--temperature 0.8 --seed 1", "--temperature 0.8 --seed 2",
        "--temperature 1.0 --top-p 0.9 --seed 3",
    };

    BT_CHECK(fd >= 0 && s != NULL);
    BT_CHECK(write(fd, schema, strlen(schema)) == (ssize_t)strlen(schema));
    close(fd);
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        cJSON *doc;
        char again[8192];

        snprintf(args, sizeof(args), "--json-schema %s --max-tokens 400 "
                 "--stats %s", path, modes[m]);
        BT_ASSERT_EQ(run(args, out, sizeof(out), err, sizeof(err)), 0);
        printf("[%s] %s\n", modes[m], out);
        if (strstr(err, "finish:stop") == NULL)
            BT_TEST_FAIL("did not end with EOS: %s", err);
        doc = cJSON_Parse(out);
        if (doc == NULL)
            BT_TEST_FAIL("output is not JSON: '%s'", out);
        if (!validate(doc, s, why, sizeof(why)))
            BT_TEST_FAIL("output '%s' fails the schema: %s", out, why);
        cJSON_Delete(doc);
        /* the same seed gives the same output */
        BT_ASSERT_EQ(run(args, again, sizeof(again), err, sizeof(err)), 0);
        BT_ASSERT_STREQ(again, out);
    }
    unlink(path);
    cJSON_Delete(s);
}

static void test_others(void)
{
    char out[8192], err[4096];
    regex_t re;
    const char *pat = "^(of|about) [a-z]+( [a-z]+){2,5}\\.$";

    /* json_object */
    BT_ASSERT_EQ(run("--json-object --temperature 1 --seed 3 --max-tokens "
                     "400 --stats", out, sizeof(out), err, sizeof(err)), 0);
    BT_CHECK(strstr(err, "finish:stop") != NULL);
    {
        cJSON *doc = cJSON_Parse(out);
        if (!cJSON_IsObject(doc))
            BT_TEST_FAIL("--json-object gave '%s'", out);
        cJSON_Delete(doc);
    }
    /* regex, checked by POSIX regexec */
    BT_ASSERT_EQ(regcomp(&re, pat, REG_EXTENDED | REG_NOSUB), 0);
    for (int seed = 0; seed < 3; seed++) {
        char args[256];
        snprintf(args, sizeof(args), "--regex '(of|about) [a-z]+( [a-z]+)"
                 "{2,5}\\.' --temperature 0.7 --seed %d --stats", seed);
        BT_ASSERT_EQ(run(args, out, sizeof(out), err, sizeof(err)), 0);
        printf("[regex seed %d] %s\n", seed, out);
        BT_CHECK(strstr(err, "finish:stop") != NULL);
        if (regexec(&re, out, 0, NULL, 0) != 0)
            BT_TEST_FAIL("'%s' does not match %s", out, pat);
    }
    regfree(&re);
    /* choice */
    for (int seed = 0; seed < 3; seed++) {
        char args[256];
        snprintf(args, sizeof(args), "--choice 'of stars,of the sea,nothing'"
                 " --temperature 1 --seed %d", seed);
        BT_ASSERT_EQ(run(args, out, sizeof(out), err, sizeof(err)), 0);
        if (strcmp(out, "of stars") != 0 && strcmp(out, "of the sea") != 0 &&
            strcmp(out, "nothing") != 0)
            BT_TEST_FAIL("--choice gave '%s'", out);
    }
    /* refusals */
    BT_ASSERT_EQ(run("--regex '(a'", out, sizeof(out), err, sizeof(err)), 2);
    BT_CHECK(strstr(err, "missing ')'") != NULL);
    BT_ASSERT_EQ(run("--grammar 'json_schema:{\"type\":\"integer\","
                     "\"multipleOf\":3}'", out, sizeof(out), err,
                     sizeof(err)), 2);
    BT_CHECK(strstr(err, "'multipleOf' is not supported") != NULL);
    BT_ASSERT_EQ(run("--json-object --regex a", out, sizeof(out), err,
                     sizeof(err)), 2);
    BT_CHECK(strstr(err, "at most one of") != NULL);
    BT_ASSERT_EQ(run("--json-schema /nonexistent.json", out, sizeof(out),
                     err, sizeof(err)), 2);
    BT_CHECK(strstr(err, "cannot read schema") != NULL);
}

int main(void)
{
    test_schema();
    test_others();
    printf("ok\n");
    return 0;
}
