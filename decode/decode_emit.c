/*
 * decode_emit.c - sampled tokens to the client: detokenize, stop ids
 * and strings, the length limit, logprobs, one TokenOut per sequence and
 * step into the outbox.
 */
#include "decode_int.h"

#include <string.h>

/* lp: the logprobs of ids[0] when n is 1 (SamplingParams.logprobs), else
 * NULL. */
static void send_tokens(decode_t *dec, decode_seq_t *s, int index,
                        const int *ids, int n, const char *text,
                        size_t text_len, Baton__FinishReason finish,
                        const sampler_logprobs_t *lp)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__TokenOut out = BATON__TOKEN_OUT__INIT;
    float logprob;

    if (lp != NULL && n == 1) {
        logprob = lp->logprob;
        out.n_logprobs = 1;
        out.logprobs = &logprob;
        out.n_top_ids = (size_t)lp->n_top;
        out.top_ids = (int32_t *)lp->top_ids;
        out.n_top_logprobs = (size_t)lp->n_top;
        out.top_logprobs = (float *)lp->top_logprobs;
    }

    out.has_request_id = 1;
    out.request_id = s->id;
    out.has_epoch = 1;
    out.epoch = s->epoch;
    out.has_index = 1;
    out.index = (uint32_t)index;
    out.n_ids = (size_t)n;
    out.ids = (int32_t *)ids;
    if (text_len > 0) {
        out.has_text = 1;
        out.text.data = (uint8_t *)text;
        out.text.len = text_len;
    }
    if (finish != BATON__FINISH_REASON__FINISH_NONE) {
        out.has_finish = 1;
        out.finish = finish;
    } else if (s->stop != NULL) {
        /* The router keeps it: a failover continues the matching. */
        size_t n_held;
        const char *held = stop_held(s->stop, &n_held);
        if (n_held > 0) {
            out.has_stop_held = 1;
            out.stop_held.data = (uint8_t *)held;
            out.stop_held.len = n_held;
        }
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_TOKEN_OUT;
    msg.token_out = &out;
    decode__send_msg(dec, &msg);
}

/* Handles n new tokens of `s` in order (one TokenOut for all of them);
 * stops at the first that ends the request: nothing after a stop id,
 * stop string or the length limit goes out.  Returns true when it
 * finished. */
bool decode__seq_emit_n(decode_t *dec, decode_seq_t *s, const int *toks, int n)
{
    /* logprobs come with plain steps only (one token; speculative
     * decoding refuses requests that want them) */
    const sampler_logprobs_t *lp = n == 1 && s->has_lp ? &s->lp : NULL;
    char piece[512], shown[8192];
    size_t shown_len = 0;
    Baton__FinishReason finish = BATON__FINISH_REASON__FINISH_NONE;
    int index = s->n_generated, ids[SPEC_MAX_DEPTH + 2], n_ids = 0;

    for (int i = 0; i < n && finish == BATON__FINISH_REASON__FINISH_NONE;
         i++) {
        int tok = toks[i];
        size_t piece_len = 0, len = 0;
        stop_reason_t reason;

        /* room for this token's text and a final flush */
        if (sizeof(shown) - shown_len < 2 * sizeof(piece) + 1024 ||
            n_ids == (int)(sizeof(ids) / sizeof(ids[0]))) {
            send_tokens(dec, s, index, ids, n_ids, shown, shown_len,
                        finish, NULL);
            index += n_ids;
            n_ids = 0;
            shown_len = 0;
        }
        s->tokens[s->n_tokens++] = tok;
        if (s->stream != NULL &&
            tok_stream_push(s->stream, tok, piece, sizeof(piece),
                            &piece_len) != BT_OK)
            piece_len = 0;
        reason = stop_feed(s->stop, tok, piece, piece_len,
                           shown + shown_len, sizeof(shown) - shown_len,
                           &len);
        shown_len += len;
        if (reason != STOP_EOS) {
            s->n_generated++;
            ids[n_ids++] = tok;
        }
        if (reason == STOP_NONE && s->n_tokens > dec->max_context)
            reason = STOP_LENGTH; /* the new token cannot be fed */
        if (reason != STOP_NONE) {
            finish = reason == STOP_LENGTH
                         ? BATON__FINISH_REASON__FINISH_LENGTH
                         : BATON__FINISH_REASON__FINISH_STOP;
            if (reason != STOP_STRING) {
                size_t tail = 0;
                stop_flush(s->stop, shown + shown_len,
                           sizeof(shown) - shown_len, &tail);
                shown_len += tail;
                if (s->stream != NULL &&
                    tok_stream_flush(s->stream, shown + shown_len,
                                     sizeof(shown) - shown_len,
                                     &tail) == BT_OK)
                    shown_len += tail;
            }
        }
    }
    if (n_ids > 0 || shown_len > 0 ||
        finish != BATON__FINISH_REASON__FINISH_NONE)
        send_tokens(dec, s, index, ids, n_ids, shown, shown_len, finish,
                    lp);
    s->has_lp = false;
    dec->tokens_out += (uint64_t)n_ids;
    return finish != BATON__FINISH_REASON__FINISH_NONE;
}

/* Handles one sampled token of `s`; returns true when it finished. */
static bool seq_emit(decode_t *dec, decode_seq_t *s, int tok)
{
    return decode__seq_emit_n(dec, s, &tok, 1);
}

/* Emits the tokens the previous step sampled (step() calls it while the
 * GPU runs the next step).  A sequence that ends here is removed, or,
 * when the running step holds it, marked so step() drops its row and
 * removes it after the wait. */
void decode__emit_pending(decode_t *dec)
{
    int n = dec->n_emit;

    dec->n_emit = 0;
    for (int i = 0; i < n; i++) {
        decode_seq_t *s = dec->emit_q[i];
        s->pend = false;
        s->n_tokens--; /* seq_emit appends it again */
        if (seq_emit(dec, s, dec->emit_tok[i])) {
            if (s->in_step)
                s->finished = true;
            else
                decode__seq_remove(dec, s);
        }
    }
    decode__send_outbox(dec);
}
