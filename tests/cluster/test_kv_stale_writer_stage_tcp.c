/*
 * test_kv_stale_writer_stage_tcp.c - the staged stale-writer scenario of
 * kv_stale_writer.h with every process on UCX_TLS=tcp, where UCX
 * checks no key (software RMA): the decode worker takes window data and
 * per-layer commits only as messages it checks, refuses the stale
 * writer's and counts them (baton_worker_kv_writes_refused_total), runs
 * UCX without RMA so the writer's raw puts at the unmapped window's
 * address are dropped, and B is golden-exact.
 *
 * Run: ctest -R cluster/test_kv_stale_writer_stage_tcp (about 10 s).
 */
#include "kv_stale_writer.h"

int main(void)
{
    return stale_writer_main(&stale_link_stage, true);
}
