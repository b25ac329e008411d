/*
 * bt_test.h - assertion macros for tests: they print both operands and
 * file:line, never compile out, and exit non-zero on the first failure.
 */
#ifndef BT_TESTS_TEST_H
#define BT_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BT_TEST_FAIL(...)                                                   \
    do {                                                                    \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
        fprintf(stderr, __VA_ARGS__);                                       \
        fprintf(stderr, "\n");                                              \
        exit(1);                                                            \
    } while (0)

#define BT_CHECK(_cond)                                                     \
    do {                                                                    \
        if (!(_cond))                                                       \
            BT_TEST_FAIL("check failed: %s", #_cond);                       \
    } while (0)

#define BT_ASSERT_EQ(_a, _b)                                                \
    do {                                                                    \
        long long _va = (long long)(_a), _vb = (long long)(_b);             \
        if (_va != _vb)                                                     \
            BT_TEST_FAIL("%s == %s: %lld != %lld", #_a, #_b, _va, _vb);     \
    } while (0)

#define BT_ASSERT_NE(_a, _b)                                                \
    do {                                                                    \
        long long _va = (long long)(_a), _vb = (long long)(_b);             \
        if (_va == _vb)                                                     \
            BT_TEST_FAIL("%s != %s: both %lld", #_a, #_b, _va);             \
    } while (0)

#define BT_ASSERT_OK(_expr)                                                 \
    do {                                                                    \
        int _st = (int)(_expr);                                             \
        if (_st != 0)                                                       \
            BT_TEST_FAIL("%s returned %d", #_expr, _st);                    \
    } while (0)

#define BT_ASSERT_STREQ(_a, _b)                                             \
    do {                                                                    \
        const char *_sa = (_a), *_sb = (_b);                                \
        if (strcmp(_sa, _sb) != 0)                                          \
            BT_TEST_FAIL("%s == %s: \"%s\" != \"%s\"", #_a, #_b, _sa, _sb); \
    } while (0)

#define BT_ASSERT_NEAR(_a, _b, _tol)                                        \
    do {                                                                    \
        double _da = (double)(_a), _db = (double)(_b);                      \
        if (!(fabs(_da - _db) <= (_tol)))                                   \
            BT_TEST_FAIL("%s ~= %s: %.9g vs %.9g (tol %g)", #_a, #_b, _da,  \
                         _db, (double)(_tol));                              \
    } while (0)

#define BT_TEST_PASS(_name) fprintf(stderr, "PASS %s\n", _name)

#endif /* BT_TESTS_TEST_H */
