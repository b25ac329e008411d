/*
 * test_kv_stale_writer_stage.c - a stale staged UCX writer over shared
 * memory (the single-host default) changes no other request's KV: the
 * scenario is in kv_stale_writer.h.
 *
 * Run: ctest -R cluster/test_kv_stale_writer_stage (about 10 s).
 */
#include "kv_stale_writer.h"

int main(void)
{
    return stale_writer_main(&stale_link_stage, false);
}
