/*
 * fuzz_proto_client.c - the router's client-message decoder: envelope
 * unpack, version check, and GenerateRequest validation on any bytes.
 */
#include <stddef.h>
#include <stdint.h>

#include "proto_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Baton__ClientMessage *msg = NULL;
    char err[256];

    if (proto_client_decode(data, size, &msg, err, sizeof(err)) == BT_OK &&
        msg->body_case == BATON__CLIENT_MESSAGE__BODY_GENERATE)
        proto_generate_validate(msg->generate, err, sizeof(err));
    proto_client_free(&msg);
    return 0;
}
