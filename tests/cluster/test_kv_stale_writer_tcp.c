/*
 * test_kv_stale_writer_tcp.c - the stale-writer scenario of
 * kv_stale_writer.h with every process on UCX_TLS=tcp, where UCX checks
 * no key (software RMA): the decode worker takes window data only as
 * messages it checks, refuses the stale writer's and counts them
 * (baton_worker_kv_writes_refused_total), drops its raw puts at the
 * unmapped window's address, and B is golden-exact.
 *
 * Run: ctest -R cluster/test_kv_stale_writer_tcp (about 10 s).
 */
#include "kv_stale_writer.h"

int main(void)
{
    return stale_writer_main(&stale_link_ucx, true);
}
