#include "test.h"
#include "util/bf16.h"
#include "util/error.h"

TEST(bf16_round_trip_and_rounding) {
    CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
    CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);
    /* 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even -> 1. */
    CHECK(bf16_round(1.0f + 0x1p-8f) == 1.0f);
    CHECK(bf16_round(1.0f + 0x1p-8f + 0x1p-12f) == 1.0f + 0x1p-7f);
    CHECK(isnan(bf16_round(NAN)));
    CHECK(isinf(bf16_round(INFINITY)));
}

TEST(error_messages_carry_context) {
    CHECK(k3c_errorf("tensor %s: expected %d", "x", 3) == K3C_ERR);
    k3c_error_context("loading %s", "dir");
    CHECK(strcmp(k3c_error_message(), "loading dir: tensor x: expected 3") == 0);
}
