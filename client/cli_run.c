/*
 * cli_run.c - `baton run`: one process, no cluster.  Loads a model, encodes
 * the prompt, generates with the engine and streams the continuation.
 * This is the reference path every cluster test compares against.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "cli_common.h"
#include "engine.h"
#include "model/chat_template.h"
#include "stop.h"
#include "spec/spec.h" /* --spec-head (EAGLE speculative decoding) */

/* --logprobs: one stderr line per generated token, for tools and tests:
 * "logprob index:I id:T logprob:L top:ID=LP,ID=LP,...". */
static void run_print_logprobs(int index, int tok,
                               const sampler_logprobs_t *lp)
{
    if (lp == NULL)
        return;
    fprintf(stderr, "logprob index:%d id:%d logprob:%.9g top:", index, tok,
            lp->logprob);
    for (int i = 0; i < lp->n_top; i++)
        fprintf(stderr, "%s%d=%.9g", i ? "," : "", lp->top_ids[i],
                lp->top_logprobs[i]);
    fprintf(stderr, "\n");
}

/* --prompt-logprobs: "prompt_logprob pos:P id:T logprob:L top:..." for
 * positions 1.. of the prompt. */
static void run_print_prompt_logprobs(const sampler_prompt_lp_t *plp,
                                      const int *tokens)
{
    for (int p = 1; plp != NULL && p < plp->n; p++) {
        fprintf(stderr, "prompt_logprob pos:%d id:%d logprob:%.9g top:", p,
                tokens[p], plp->lps[p - 1]);
        for (int i = 0; i < plp->k; i++)
            fprintf(stderr, "%s%d=%.9g", i ? "," : "",
                    plp->top_ids[(size_t)(p - 1) * plp->k + i],
                    plp->top_lps[(size_t)(p - 1) * plp->k + i]);
        fprintf(stderr, "\n");
    }
}

static void run_usage(FILE *out)
{
    fprintf(out,
"usage: baton run --model PATH [--tokenizer PATH]\n"
"                 (--prompt TEXT | --prompt-ids \"1 2 3\") [options]\n"
"\n"
"Generates a continuation in this process and streams it to stdout.\n"
"\n"
"  --model PATH           llama2.c .bin, Hugging Face directory, or synth:NAME\n"
"  --tokenizer PATH       llama2.c .bin, tokenizer.json or HF directory\n"
"                         (default: the model directory's tokenizer.json)\n"
"  --prompt TEXT          prompt text (BOS prepended when the tokenizer\n"
"                         says so)\n"
"  --chat                 treat --prompt as a user message in the model's\n"
"                         chat format (tokenizer_config.json's template)\n"
"  --system TEXT          system message for --chat\n"
"  --chat-template NAME   llama3, chatml, qwen, mistral, llama2 or plain\n"
"  --prompt-ids IDS       prompt token ids, space or comma separated\n"
"  --ids                  print generated ids on one line instead of text\n"
"  --stats                print timing and tokens/s to stderr\n"
"  --logprobs N           print each generated token's logprob and its N\n"
"                         (0..20) most likely alternatives to stderr, one\n"
"                         line a token (log_softmax of the raw logits;\n"
"                         speculative decoding is turned off)\n"
"  --prompt-logprobs N    print each prompt token's logprob (the first has\n"
"                         none) and N alternatives to stderr, the numbers\n"
"                         echo returns\n"
"\nstructured output (one of; speculative decoding is turned off):\n"
"  --json-schema FILE     output matches the JSON schema in FILE\n"
"  --json-object          output is one JSON object\n"
"  --regex R              output matches the regex R in full\n"
"  --choice A,B,C         output is exactly one of the choices\n"
"  --grammar KIND:TEXT    the same as one spec: json_object,\n"
"                         json_schema:SCHEMA, regex:R or choice:[\"A\"]\n"
"\nspeculative decoding (EAGLE; cpu and cuda backends):\n"
"  --spec-head PATH       draft head .safetensors (baton eagle train);\n"
"  --draft PATH           the same\n"
"  --spec off|auto|fixed  speculation off, adaptive (default), full tree\n"
"  --spec-depth D         draft tree depth (default 8)\n"
"  --spec-topk K          draft children per node (default 4)\n"
"  --spec-tokens T        draft tokens verified per step (default 16)\n"
"  --spec-fixed           always draft the full tree (default: adaptive)\n"
CLI_SAMPLING_HELP
CLI_ENGINE_HELP);
}

/* Builds the "<kind>:<text>" grammar spec (worker/grammar/grammar.h) of
 * a structured-output option into *spec_p (bt_malloc'ed).  Returns 0, or
 * 2 with a message for a bad value. */
static int run_grammar_spec(int opt, const char *arg, char **spec_p)
{
    char *text = NULL, *spec;
    size_t len = 0;

    switch (opt) {
    case 3100: /* --json-schema FILE */
        if (bt_read_file(arg, 1 << 20, &text, &len) != BT_OK) {
            fprintf(stderr, "baton run: cannot read schema '%s': %s\n", arg,
                    bt_error_last());
            return 2;
        }
        spec = bt_malloc(len + 16, "cli_grammar");
        if (spec != NULL)
            snprintf(spec, len + 16, "json_schema:%s", text);
        bt_free(text);
        break;
    case 3101: /* --json-object */
        spec = bt_strdup("json_object:", "cli_grammar");
        break;
    case 3102: /* --regex R */
        len = strlen(arg) + 8;
        spec = bt_malloc(len, "cli_grammar");
        if (spec != NULL)
            snprintf(spec, len, "regex:%s", arg);
        break;
    case 3103: { /* --choice A,B,C: a JSON array of the parts */
        cJSON *list = cJSON_CreateArray();
        const char *p = arg;
        char *json;
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
            char *part = bt_strndup(p, n, "cli_grammar");
            if (part == NULL)
                break;
            cJSON_AddItemToArray(list, cJSON_CreateString(part));
            bt_free(part);
            if (comma == NULL)
                break;
            p = comma + 1;
        }
        json = cJSON_PrintUnformatted(list);
        cJSON_Delete(list);
        spec = NULL;
        if (json != NULL) {
            len = strlen(json) + 8;
            spec = bt_malloc(len, "cli_grammar");
            if (spec != NULL)
                snprintf(spec, len, "choice:%s", json);
            cJSON_free(json);
        }
        break;
    }
    default: /* --grammar SPEC */
        spec = bt_strdup(arg, "cli_grammar");
        break;
    }
    if (spec == NULL) {
        fprintf(stderr, "baton run: out of memory\n");
        return 2;
    }
    if (*spec_p != NULL) {
        bt_free(spec);
        fprintf(stderr, "baton run: give at most one of --json-schema, "
                        "--json-object, --regex, --choice, --grammar\n");
        return 2;
    }
    *spec_p = spec;
    return 0;
}

/* Encodes the prompt, in the chat format when asked: the prompt becomes
 * the user message (after an optional system message), formatted by the
 * named template or the one the tokenizer's config implies. */
static bt_status_t run_encode(const tok_t *tok, const char *prompt, bool chat,
                              const char *system_msg, const char *template_name,
                              const char *arch, int **ids_p, int *n_p)
{
    chat_template_t tmpl;
    chat_msg_t msgs[2];
    int n_msgs = 0;
    char *text = NULL;
    bt_status_t status;

    if (!chat)
        return tok_encode(tok, prompt, strlen(prompt), tok_adds_bos(tok),
                          ids_p, n_p);
    if (template_name != NULL) {
        status = chat_template_from_name(template_name, &tmpl);
        if (status != BT_OK)
            return status;
    } else {
        tmpl = chat_template_detect(tok_chat_template(tok), arch);
    }
    if (system_msg != NULL)
        msgs[n_msgs++] = (chat_msg_t){ "system", system_msg };
    msgs[n_msgs++] = (chat_msg_t){ "user", prompt };
    status = chat_format(tmpl, msgs, n_msgs, true,
                         tok_bos_id(tok) >= 0 ? tok_piece(tok, tok_bos_id(tok))
                                              : NULL,
                         tok_eos_id(tok) >= 0 ? tok_piece(tok, tok_eos_id(tok))
                                              : NULL,
                         &text);
    if (status != BT_OK)
        return status;
    status = tok_encode(tok, text, strlen(text), tok_adds_bos(tok), ids_p,
                        n_p);
    bt_free(text);
    return status;
}

int cli_run_main(int argc, char **argv)
{
    engine_config_t ecfg;
    sampler_params_t sp;
    stop_config_t scfg;
    cli_gen_opts_t gen;
    const char *prompt = NULL, *prompt_ids = NULL;
    const char *system_msg = NULL, *template_name = NULL;
    bool chat = false;
    bool print_ids = false, stats = false;
    engine_t *engine = NULL;
    engine_seq_t *seq = NULL;
    stop_t *stop = NULL;
    tok_stream_t *stream = NULL;
    int *ids = NULL, n_ids = 0, ret = 1;
    stop_reason_t reason = STOP_NONE;
    uint64_t t_start, t_first = 0, t_end;
    int n_gen = 0;
    bt_status_t status;
    /* speculative decoding (--spec-head) */
    const char *spec_head_path = NULL;
    bool spec_off = false; /* --spec off: ignore the head */
    spec_config_t spec_cfg;
    spec_head_t *spec_head = NULL;
    spec_t *spec = NULL;
    spec_seq_t *sseq = NULL;
    /* structured output */
    char *grammar_spec = NULL;
    grammar_t *grammar = NULL;
    static const struct option long_opts[] = {
        CLI_ENGINE_OPTIONS,
        CLI_SAMPLING_OPTIONS,
        { "prompt", required_argument, NULL, 'p' },
        { "prompt-ids", required_argument, NULL, 'I' },
        { "ids", no_argument, NULL, 'i' },
        { "stats", no_argument, NULL, 'S' },
        { "logprobs", required_argument, NULL, 3200 },
        { "prompt-logprobs", required_argument, NULL, 3201 },
        { "chat", no_argument, NULL, 'c' },
        { "system", required_argument, NULL, 's' },
        { "chat-template", required_argument, NULL, 'C' },
        /* speculative decoding */
        { "spec-head", required_argument, NULL, 3000 },
        { "spec-depth", required_argument, NULL, 3001 },
        { "spec-topk", required_argument, NULL, 3002 },
        { "spec-tokens", required_argument, NULL, 3003 },
        { "spec-fixed", no_argument, NULL, 3004 },
        { "draft", required_argument, NULL, 3000 },
        { "spec", required_argument, NULL, 3005 },
        /* structured output */
        { "json-schema", required_argument, NULL, 3100 },
        { "json-object", no_argument, NULL, 3101 },
        { "regex", required_argument, NULL, 3102 },
        { "choice", required_argument, NULL, 3103 },
        { "grammar", required_argument, NULL, 3104 },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    engine_config_init(&ecfg);
    cli_gen_opts_init(&gen);
    spec_config_init(&spec_cfg);
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case 'p': prompt = optarg; break;
        case 'I': prompt_ids = optarg; break;
        case 'i': print_ids = true; break;
        case 'S': stats = true; break;
        case 'c': chat = true; break;
        case 's': system_msg = optarg; break;
        case 'C': template_name = optarg; chat = true; break;
        case 3000: spec_head_path = optarg; break;
        case 3001:
        case 3002:
        case 3003: {
            int v;
            if (bt_parse_int(optarg, &v) != BT_OK || v <= 0 || v > 256) {
                fprintf(stderr, "baton run: --spec-depth/--spec-topk/"
                                "--spec-tokens take 1..256, not '%s'\n",
                        optarg);
                return 2;
            }
            if (c == 3001)
                spec_cfg.depth = v;
            else if (c == 3002)
                spec_cfg.topk = v;
            else
                spec_cfg.tokens = v;
            break;
        }
        case 3004: spec_cfg.adaptive = false; break;
        case 3005:
            if (strcmp(optarg, "off") == 0) {
                spec_off = true;
            } else if (strcmp(optarg, "auto") == 0) {
                spec_cfg.adaptive = true;
            } else if (strcmp(optarg, "fixed") == 0) {
                spec_cfg.adaptive = false;
            } else {
                fprintf(stderr, "baton run: --spec takes off, auto or "
                                "fixed, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 3100:
        case 3101:
        case 3102:
        case 3103:
        case 3104:
            if (run_grammar_spec(c, optarg, &grammar_spec) != 0) {
                bt_free(grammar_spec);
                return 2;
            }
            break;
        case 3200:
        case 3201: {
            int v;
            char err[160];
            if (bt_parse_int(optarg, &v) != BT_OK ||
                params_check(c == 3200 ? "top_logprobs" : "prompt_logprobs",
                             v, err, sizeof(err)) != BT_OK) {
                fprintf(stderr, "baton run: --%s takes an integer in "
                        "[0, %d], not '%s'\n",
                        c == 3200 ? "logprobs" : "prompt-logprobs",
                        PARAMS_MAX_LOGPROBS, optarg);
                bt_free(grammar_spec);
                return 2;
            }
            if (c == 3200) {
                gen.params.sampling.logprobs = true;
                gen.params.sampling.top_logprobs = v;
            } else {
                gen.params.sampling.prompt_logprobs = true;
                gen.params.sampling.prompt_top_logprobs = v;
            }
            break;
        }
        case 'h': run_usage(stdout); bt_free(grammar_spec); return 0;
        default:
            if (cli_engine_option(c, optarg, &ecfg) == 0 ||
                cli_sampling_option(c, optarg, &gen) == 0)
                break;
            if (c != '?')
                fprintf(stderr, "baton run: bad value '%s'\n", optarg);
            run_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton run: unexpected argument '%s'\n", argv[optind]);
        bt_free(grammar_spec);
        return 2;
    }
    if (ecfg.model_path == NULL || (prompt == NULL) == (prompt_ids == NULL)) {
        fprintf(stderr, "baton run: need --model and exactly one of --prompt "
                        "or --prompt-ids\n");
        run_usage(stderr);
        bt_free(grammar_spec);
        return 2;
    }
    if ((chat || system_msg != NULL) && prompt == NULL) {
        fprintf(stderr, "baton run: --chat needs --prompt\n");
        return 2;
    }
    if (cli_gen_validate(&gen, "baton run") != BT_OK)
        return 2;
    sp = gen.params.sampling;
    if (prompt_ids != NULL &&
        bt_parse_int_list(prompt_ids, &ids, &n_ids) != BT_OK) {
        fprintf(stderr, "baton run: --prompt-ids must be a list of integers\n");
        return 2;
    }

    status = engine_create(&ecfg, &engine);
    if (status != BT_OK)
        goto out;
    if (prompt != NULL) {
        if (prompt[0] == '\0') {
            BT_ERROR(BT_ERR_INVALID_ARG, "CLI", "empty prompt");
            goto out;
        }
        if (engine_tokenizer(engine) == NULL) {
            BT_ERROR(BT_ERR_INVALID_ARG, "CLI",
                     "--prompt needs a tokenizer: pass --tokenizer, or use "
                     "--prompt-ids");
            ret = 2;
            goto out;
        }
        status = run_encode(engine_tokenizer(engine), prompt, chat,
                            system_msg, template_name,
                            model_architecture(engine_model(engine)), &ids,
                            &n_ids);
        if (status != BT_OK)
            goto out;
    }
    status = cli_stop_config(&gen, model_config(engine_model(engine)),
                             engine_max_context(engine), n_ids, &scfg);
    if (status != BT_OK)
        goto out;
    status = stop_create(&scfg, &stop);
    if (status != BT_OK)
        goto out;
    status = engine_seq_create(engine, ids, n_ids, &sp, &seq);
    if (status != BT_OK)
        goto out;
    if (grammar_spec != NULL) {
        const grammar_vocab_t *gvocab;

        if ((status = engine_grammar_vocab(engine, &gvocab)) != BT_OK ||
            (status = grammar_create_spec(grammar_spec, gvocab, &grammar)) !=
                BT_OK ||
            (status = engine_seq_set_grammar(engine, seq, grammar, -1)) !=
                BT_OK) {
            fprintf(stderr, "baton run: %s\n", bt_error_last());
            ret = 2;
            goto out;
        }
        /* drafts would be verified against the first position's mask
         * only: a constrained sequence is decoded one token at a time */
        if (spec_head_path != NULL && !spec_off)
            fprintf(stderr, "baton run: speculative decoding is off for "
                            "structured output\n");
        spec_off = true;
    }
    if (sp.logprobs || sp.prompt_logprobs) {
        /* a verified draft has no per-token rows on the host */
        if (spec_head_path != NULL && !spec_off)
            fprintf(stderr, "baton run: speculative decoding is off for "
                            "--logprobs\n");
        spec_off = true;
    }
    if (spec_off)
        spec_head_path = NULL;
    if (spec_head_path != NULL) {
        if ((status = spec_head_load(engine_model(engine), spec_head_path,
                                     &spec_head)) != BT_OK ||
            (status = spec_create(engine, spec_head, &spec_cfg, &spec)) !=
                BT_OK ||
            (status = spec_seq_create(spec, seq, &sseq)) != BT_OK)
            goto out;
    }
    if (!print_ids && engine_tokenizer(engine) != NULL) {
        status = tok_stream_create(engine_tokenizer(engine), ids[n_ids - 1],
                                   &stream);
        if (status != BT_OK)
            goto out;
        tok_stream_set_skip_special(stream, sp.skip_special_tokens);
    }

    t_start = bt_time_ns();
    while (reason == STOP_NONE) {
        int tok;
        char piece[512], shown[2048];
        size_t piece_len = 0, shown_len = 0;

        status = sseq != NULL ? spec_seq_next(spec, sseq, &tok)
                              : engine_step(engine, &seq, 1, 0, &tok);
        if (status != BT_OK)
            goto out;
        if (tok < 0)
            continue; /* a prompt chunk without a sample */
        if (n_gen++ == 0) {
            t_first = bt_time_ns();
            run_print_prompt_logprobs(engine_seq_prompt_logprobs(seq),
                                      engine_seq_tokens(seq));
        }

        if (stream != NULL) {
            status = tok_stream_push(stream, tok, piece, sizeof(piece),
                                     &piece_len);
            if (status != BT_OK)
                goto out;
        }
        reason = stop_feed(stop, tok, piece, piece_len, shown, sizeof(shown),
                           &shown_len);
        if (sp.logprobs && sseq == NULL && reason != STOP_EOS)
            run_print_logprobs(n_gen - 1, tok,
                               sampler_last_logprobs(
                                   engine_seq_sampler(seq)));
        if (print_ids) {
            if (reason != STOP_EOS)
                printf("%s%d", n_gen > 1 ? " " : "", tok);
        } else if (stream != NULL) {
            fwrite(shown, 1, shown_len, stdout);
        } else if (reason != STOP_EOS) {
            printf("%s%d", n_gen > 1 ? " " : "", tok);
        }
        fflush(stdout);
        if (reason == STOP_NONE &&
            (sseq != NULL ? n_ids + n_gen : engine_seq_len(seq)) >
                engine_max_context(engine))
            reason = STOP_LENGTH;
    }
    if (stream != NULL) {
        char tail[64];
        size_t tail_len = 0;
        if (reason != STOP_STRING &&
            tok_stream_flush(stream, tail, sizeof(tail), &tail_len) == BT_OK)
            fwrite(tail, 1, tail_len, stdout);
    }
    printf("\n");
    t_end = bt_time_ns();
    if (stats) {
        double total = (double)(t_end - t_start) * 1e-9;
        double decode = (double)(t_end - t_first) * 1e-9;
        fprintf(stderr,
                "prompt_tokens:%d generated:%d finish:%s ttft_ms:%.3f "
                "decode_tok_s:%.1f total_s:%.4f\n",
                n_ids, sseq != NULL ? n_gen : engine_seq_n_generated(seq),
                stop_reason_str(reason),
                (double)(t_first - t_start) * 1e-6,
                n_gen > 1 ? (double)(n_gen - 1) / decode : 0.0, total);
    }
    if (spec != NULL)
        fprintf(stderr, "accept-length: %.2f\n", spec_accept_length(spec));
    ret = 0;

out:
    if (ret == 1)
        fprintf(stderr, "baton run: %s\n",
                bt_error_last()[0] ? bt_error_last() : "failed");
    tok_stream_destroy(&stream);
    spec_seq_destroy(&sseq);
    spec_destroy(&spec);
    spec_head_destroy(&spec_head);
    engine_seq_destroy(engine, &seq);
    grammar_destroy(&grammar);
    bt_free(grammar_spec);
    stop_destroy(&stop);
    engine_destroy(&engine);
    bt_free(ids);
    cli_gen_opts_cleanup(&gen);
    return ret;
}
