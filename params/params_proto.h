/*
 * params_proto.h - the parameter contract (params.h) to and from the wire
 * (proto/client.proto's SamplingParams and GenerateRequest): the one place
 * the fields are copied between the two.
 */
#ifndef BT_PARAMS_PARAMS_PROTO_H
#define BT_PARAMS_PARAMS_PROTO_H

#include "client.pb-c.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sampling fields of `sp` (absent fields have the message's defaults,
 * which are params_sampling_init's); NULL: the defaults. */
void params_sampling_from_proto(const Baton__SamplingParams *sp,
                                params_sampling_t *s);

/* Fills `sp` (initialised here) with every field present. */
void params_sampling_to_proto(const params_sampling_t *s,
                              Baton__SamplingParams *sp);

/* A GenerateRequest's contract: sampling, max_tokens, stop ids and
 * strings (borrowed from `g`: valid while g is) and ignore_eos, then
 * params_validate.  BT_ERR_INVALID_ARG with the validator's message (and
 * more stop conditions than the contract holds are refused, never
 * dropped). */
bt_status_t params_from_generate(const Baton__GenerateRequest *g,
                                 params_t *p, char *err, size_t err_len,
                                 const char **param_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_PARAMS_PARAMS_PROTO_H */
