/*
 * fuzz_proto_control.c - the control-plane decoder shared by router and
 * workers: envelope unpack and version check on any bytes, then a walk
 * over the fields workers trust after decoding (sizes of repeated
 * fields, KV inline payloads, grants).
 */
#include <stddef.h>
#include <stdint.h>

#include "params_proto.h"
#include "proto_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Baton__ControlMessage *msg = NULL;
    char err[256];
    size_t sum = 0;

    if (proto_control_decode(data, size, &msg, err, sizeof(err)) == BT_OK) {
        switch (msg->body_case) {
        case BATON__CONTROL_MESSAGE__BODY_KV_READY:
            for (size_t i = 0; i < msg->kv_ready->n_kv_inline; i++)
                sum += msg->kv_ready->kv_inline[i].len;
            for (size_t i = 0; i < msg->kv_ready->n_tokens; i++)
                sum += (size_t)msg->kv_ready->tokens[i];
            break;
        case BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK:
            if (msg->prefill_task->grant != NULL)
                for (size_t i = 0; i < msg->prefill_task->grant->n_block_ids;
                     i++)
                    sum += (size_t)msg->prefill_task->grant->block_ids[i];
            if (msg->prefill_task->sampling != NULL) {
                params_sampling_t sp;
                params_sampling_from_proto(msg->prefill_task->sampling, &sp);
                params_sampling_validate(&sp, err, sizeof(err), NULL);
            }
            break;
        default:
            break;
        }
    }
    proto_control_free(&msg);
    return (int)(sum & 0);
}
