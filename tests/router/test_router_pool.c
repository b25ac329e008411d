/*
 * test_router_pool.c - precision routing's pure logic (router_pool.c):
 * pools by precision and KV dtype, which classes fail at once and which
 * wait (nothing registered, one side of a class only, aggregated workers
 * with --aggregate never), the messages, pair matching, and the least-
 * loaded and round-robin picks keeping to the class they are given.
 */
#include <string.h>

#include "bt_test.h"
#include "router_int.h"

static router_t g_router; /* zeroed: only workers and aggregate are read */

static router_worker_t *add(const char *name, Baton__Role role,
                            bool both, const char *precision,
                            const char *kv)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &g_router.workers[i];
        if (w->used)
            continue;
        memset(w, 0, sizeof(*w));
        w->used = true;
        w->uid = (uint64_t)i + 1;
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->role = role;
        w->can_prefill = both;
        snprintf(w->precision, sizeof(w->precision), "%s", precision);
        snprintf(w->kv_dtype, sizeof(w->kv_dtype), "%s", kv);
        w->block_size = 16;
        w->total_kv = 100;
        w->est_free_kv = 100;
        return w;
    }
    BT_TEST_FAIL("worker table full");
    return NULL;
}

/* router__class_unservable for `precision`; its message in why. */
static bool unservable(const char *precision, char *why, size_t size)
{
    router_pool_t pools[ROUTER_MAX_POOLS];
    int n = router__pools(&g_router, pools);

    why[0] = '\0';
    return router__class_unservable(&g_router, pools, n, precision, why,
                                    size);
}

static void test_classes(void)
{
    router_pool_t pools[ROUTER_MAX_POOLS];
    router_worker_t *pb, *d8, *p8, *a32;
    char why[512];

    memset(&g_router, 0, sizeof(g_router));
    g_router.aggregate = 1;
    /* nothing registered: every class waits for workers */
    BT_CHECK(!unservable("", why, sizeof(why)));
    BT_CHECK(!unservable("fp8", why, sizeof(why)));

    pb = add("pb", BATON__ROLE__ROLE_PREFILL, false, "bf16", "bf16");
    d8 = add("d8", BATON__ROLE__ROLE_DECODE, false, "fp8", "fp8");
    BT_ASSERT_EQ(router__pools(&g_router, pools), 2);
    BT_ASSERT_EQ(pools[0].n_prefill, 1);
    BT_ASSERT_EQ(pools[1].n_decode, 1);
    /* no pair of one class anywhere: any-class requests fail now */
    BT_CHECK(unservable("", why, sizeof(why)));
    BT_CHECK(strstr(why, "no prefill/decode pair") != NULL);
    BT_CHECK(strstr(why, "bf16/kv bf16 1P+0D+0both") != NULL);
    BT_CHECK(strstr(why, "fp8/kv fp8 0P+1D+0both") != NULL);
    /* bf16 and fp8 have one side each: they wait for the other */
    BT_CHECK(!unservable("bf16", why, sizeof(why)));
    BT_CHECK(!unservable("fp8", why, sizeof(why)));
    /* f32 has none */
    BT_CHECK(unservable("f32", why, sizeof(why)));
    BT_ASSERT_STREQ(why, "no worker serves precision 'f32' (registered: "
                         "bf16 x1, fp8 x1)");

    p8 = add("p8", BATON__ROLE__ROLE_PREFILL, false, "fp8", "fp8");
    BT_CHECK(!unservable("", why, sizeof(why)));
    BT_CHECK(!unservable("fp8", why, sizeof(why)));
    BT_CHECK(router__pair_matches(p8, d8));
    BT_CHECK(!router__pair_matches(pb, d8));

    /* an aggregated worker is its own pair, unless --aggregate never */
    a32 = add("a32", BATON__ROLE__ROLE_DECODE, true, "f32", "f32");
    BT_CHECK(!unservable("f32", why, sizeof(why)));
    BT_CHECK(router__pair_matches(a32, a32));
    g_router.aggregate = 0;
    BT_CHECK(!unservable("f32", why, sizeof(why))); /* decode side only */
    g_router.aggregate = 1;

    /* a draining worker is in no pool */
    a32->draining = true;
    BT_CHECK(unservable("f32", why, sizeof(why)));
    BT_CHECK(strstr(why, "f32") != NULL && strstr(why, "fp8 x2") != NULL);
    a32->draining = false;

    /* precision equal, KV dtype not: another pool */
    {
        router_worker_t *d8b = add("d8b", BATON__ROLE__ROLE_DECODE, false,
                                   "fp8", "bf16");
        router_worker_t *nul = add("nul", BATON__ROLE__ROLE_DECODE, false,
                                   "", "");
        router_class_t any = { "", "" }, fp8 = { "fp8", "" };
        BT_CHECK(!router__pair_matches(p8, d8b));
        BT_CHECK(router__worker_in_class(d8b, &fp8));
        BT_CHECK(router__worker_in_class(nul, &any));
        BT_CHECK(!router__worker_in_class(nul, &fp8));
        d8b->used = false;
        nul->used = false;
    }
}

static void test_picks(void)
{
    static const char *const policies[] = { "least-loaded", "round-robin" };
    router_req_t req;

    memset(&req, 0, sizeof(req));
    memset(&g_router, 0, sizeof(g_router));
    g_router.aggregate = 1;
    add("pb", BATON__ROLE__ROLE_PREFILL, false, "bf16", "bf16");
    add("db", BATON__ROLE__ROLE_DECODE, false, "bf16", "bf16");
    add("p8", BATON__ROLE__ROLE_PREFILL, false, "fp8", "fp8");
    add("d8", BATON__ROLE__ROLE_DECODE, false, "fp8", "fp8");
    for (size_t k = 0; k < sizeof(policies) / sizeof(policies[0]); k++) {
        const router_policy_t *pol = router__policy_find(policies[k]);
        BT_CHECK(pol != NULL);
        for (int rep = 0; rep < 4; rep++) {
            router_class_t fp8 = { "fp8", "" }, bf16 = { "bf16", "" };
            router_class_t pair;
            router_worker_t *p, *d;
            int cached;

            p = pol->pick_prefill(&g_router, &req, &fp8, &cached);
            BT_CHECK(p != NULL);
            BT_ASSERT_STREQ(p->name, "p8");
            pair = router__worker_class(p);
            d = pol->pick_decode(&g_router, &req, 8, false, &pair, &cached);
            BT_CHECK(d != NULL);
            BT_ASSERT_STREQ(d->name, "d8");
            p = pol->pick_prefill(&g_router, &req, &bf16, &cached);
            BT_ASSERT_STREQ(p->name, "pb");
            d = pol->pick_decode(&g_router, &req, 8, false, &bf16, &cached);
            BT_ASSERT_STREQ(d->name, "db");
            /* no class asked: any prefill, and its own pool's decode */
            p = pol->pick_prefill(&g_router, &req, NULL, &cached);
            BT_CHECK(p != NULL);
            pair = router__worker_class(p);
            d = pol->pick_decode(&g_router, &req, 8, false, &pair, &cached);
            BT_CHECK(d != NULL && router__pair_matches(p, d));
        }
    }
}

int main(void)
{
    test_classes();
    test_picks();
    BT_TEST_PASS("router/pool: classes, pools, pairs and picks");
    return 0;
}
