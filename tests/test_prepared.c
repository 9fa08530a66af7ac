/* The prepared shape table of the specialized decode (decode/prepared.h), against the spec's statement
 * written out here: rows in {1,2,4,8,16,24,32,48,64}, q = 1..8 dividing rows, within q_max and the
 * engine's request count. */
#include "decode/prepared.h"
#include "test.h"

TEST(prepared_shapes_match_spec) {
    static const int set[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
    for (int qm = 1; qm <= 9; qm++)
        for (int mr = 1; mr <= 70; mr += 3) {
            int expect = 0;
            for (int rows = 0; rows <= 70; rows++)
                for (int q = 0; q <= 9; q++) {
                    int in_set = 0;
                    for (int i = 0; i < 9; i++) in_set |= set[i] == rows;
                    int want = in_set && q >= 1 && q <= 8 && q <= qm && rows % q == 0 && rows / q <= mr;
                    expect += want;
                    CHECK(k3c_prepared_shape(rows, q, qm, mr) == want);
                }
            int shapes[128][2];
            int n = k3c_prepared_shapes(qm, mr, shapes, 128);
            CHECK(n == expect);
            for (int i = 0; i < n && i < 128; i++) {
                CHECK(k3c_prepared_shape(shapes[i][0], shapes[i][1], qm, mr));
                if (i) CHECK(shapes[i][0] > shapes[i - 1][0] ||
                             (shapes[i][0] == shapes[i - 1][0] && shapes[i][1] > shapes[i - 1][1]));
            }
        }
    /* the spec's default engine (q_max 8, 64 requests): 9 decode shapes; verify q=2: 8, q=3: 2, q=4: 7, q=6: 2,
     * q=8: 6 (q = 5, 7 divide no prepared row count) */
    int shapes[64][2];
    CHECK(k3c_prepared_shapes(8, 64, shapes, 64) == 9 + 8 + 2 + 7 + 2 + 6);
}
