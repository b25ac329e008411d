/* test_fp8.c - common/bt_fp8.h against an independent reference: every
 * one of the 256 E4M3 codes decoded from the OCP definition with ldexp,
 * and f32 -> E4M3 checked against a brute-force nearest-value search
 * (ties to the even code, saturation at +-448) on every code, every
 * midpoint between neighbours and one f32 ulp either side of it, the
 * subnormal/zero/overflow edges and a million random floats. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bt_fp8.h"
#include "bt_test.h"

static double ref_value[256]; /* NAN for the two NaN codes */

/* The OCP E4M3FN definition, written from the spec, not from the code
 * under test. */
static double ref_decode(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v;

    if (e == 15 && m == 7)
        return NAN;
    v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

/* Nearest finite code by search; ties to the even code; beyond 448 the
 * saturated code; NaN -> 0x7F with the sign. */
static uint8_t ref_encode(float f)
{
    double x = f;
    int best = -1;
    double best_d = INFINITY;
    uint8_t sign = signbit(f) ? 0x80 : 0;

    if (isnan(f))
        return (uint8_t)(sign | 0x7F);
    if (fabs(x) >= 448.0)
        return (uint8_t)(sign | 0x7E);
    for (int c = 0; c < 0x7F; c++) {  /* positive finite codes */
        double d = fabs(fabs(x) - ref_value[c]);

        if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1))) {
            best = c;
            best_d = d;
        }
    }
    return (uint8_t)(sign | best);
}

static void check_encode(float f)
{
    uint8_t got = bt_f32_to_e4m3(f), want = ref_encode(f);

    if (got != want)
        BT_TEST_FAIL("bt_f32_to_e4m3(%.9g) = 0x%02x, reference 0x%02x", f,
                     got, want);
}

int main(void)
{
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int n_checked = 0;

    for (int c = 0; c < 256; c++)
        ref_value[c] = ref_decode(c);

    /* decode: all 256 codes, bit-exact */
    for (int c = 0; c < 256; c++) {
        float got = bt_e4m3_to_f32((uint8_t)c);

        if (isnan(ref_value[c])) {
            BT_CHECK(isnan(got));
            continue;
        }
        if ((double)got != ref_value[c] || (signbit(got) != 0) != (c >= 128))
            BT_TEST_FAIL("bt_e4m3_to_f32(0x%02x) = %.9g, want %.9g", c, got,
                         ref_value[c]);
    }
    BT_ASSERT_NEAR(bt_e4m3_to_f32(0x7E), 448.0, 0);
    BT_ASSERT_NEAR(bt_e4m3_to_f32(0x01), 1.0 / 512.0, 0);
    BT_ASSERT_NEAR(bt_e4m3_to_f32(0x08), 1.0 / 64.0, 0);

    /* round trip: every non-NaN code encodes back to itself */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F)
            continue;
        BT_ASSERT_EQ(bt_f32_to_e4m3(bt_e4m3_to_f32((uint8_t)c)), c);
    }

    /* midpoints between neighbouring codes (ties), one ulp either side */
    for (int c = 0; c < 0x7E; c++) {
        float mid = (float)((ref_value[c] + ref_value[c + 1]) / 2.0);

        for (int sgn = 0; sgn < 2; sgn++) {
            float m = sgn ? -mid : mid;

            check_encode(m);
            check_encode(nextafterf(m, INFINITY));
            check_encode(nextafterf(m, -INFINITY));
            n_checked += 3;
        }
    }
    /* edges: zero, below the smallest subnormal, the saturation band */
    {
        const float edge[] = {
            0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f / 1024, 1.0f / 1024 * 1.0001f,
            1.0f / 2048, 3.0f / 2048, 448.0f, 449.0f, 463.99f, 464.0f, 465.0f,
            1e6f, -1e6f, 3.4e38f, INFINITY, -INFINITY, 1e-45f,
        };
        for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
            check_encode(edge[i]);
    }
    BT_ASSERT_EQ(bt_f32_to_e4m3(INFINITY), 0x7E);
    BT_ASSERT_EQ(bt_f32_to_e4m3(-INFINITY), 0xFE);
    BT_ASSERT_EQ(bt_f32_to_e4m3(1000.0f), 0x7E);
    BT_ASSERT_EQ(bt_f32_to_e4m3(NAN) & 0x7F, 0x7F);
    BT_ASSERT_EQ(bt_f32_to_e4m3(-0.0f), 0x80);
    /* 1 + 1/16 is the tie between 1 (0x38) and 1.125 (0x39): even wins */
    BT_ASSERT_EQ(bt_f32_to_e4m3(1.0625f), 0x38);
    BT_ASSERT_EQ(bt_f32_to_e4m3(1.1875f), 0x3A);   /* tie 1.125/1.25 */
    /* 2^-10 is the tie between 0 and the smallest subnormal: zero */
    BT_ASSERT_EQ(bt_f32_to_e4m3(1.0f / 1024), 0x00);
    BT_ASSERT_EQ(bt_f32_to_e4m3(3.0f / 1024), 0x02); /* tie 1/512, 2/512 */

    /* random floats over the whole f32 range and over the E4M3 range */
    for (int i = 0; i < 1000000; i++) {
        uint32_t u;
        float f;

        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        u = (uint32_t)(rng >> 32);
        if (i & 1) {
            memcpy(&f, &u, sizeof(f));
        } else { /* uniform-ish in [-600, 600] with fine detail */
            f = (float)((double)(u >> 8) / (double)(1u << 24) * 1200.0 -
                        600.0);
            if (i % 4 == 0)
                f = ldexpf(f, -(int)(u & 15));
        }
        check_encode(f);
        n_checked++;
    }

    /* helpers */
    BT_ASSERT_NEAR(bt_fp8_scale(448.0f), 1.0, 0);
    BT_ASSERT_NEAR(bt_fp8_scale(0.0f), 1.0, 0);
    BT_ASSERT_NEAR(bt_fp8_scale(NAN), 1.0, 0);
    BT_ASSERT_NEAR(bt_fp8_round(0.3f), 0.3125, 0);
    printf("fp8: 256 codes decoded, %d encodings checked\n", n_checked);
    return 0;
}
