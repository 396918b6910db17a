/* test_dq16_rule.c -- the DIRECT form's rule for light dq row tiles (src/cuda/dq16_rule.h, the
 * functions the CUDA kernels call): for every entry count a tile can have, with claims (version
 * 10 at head dim 128) and without (head dim 64), the tile's entries, taken in their claim order,
 * must leave exactly one writer that starts the tile -- the zero CTAs or a single store -- and
 * every other entry must add after it: an unclaimed add only onto zeros, a claimed add only
 * after waiting for the first claimant's store. (Two forms of a gate on the claims broke this
 * before their first run: bench/notes-bwd.md, hundred-and-twenty-fourth session.) */
#include <stdbool.h>

#include "check.h"
#include "cuda/dq16_rule.h"

static void check_tile(unsigned writers, bool with_claims) {
    const bool light = bl_bwd_dq16_tile(writers);
    const bool zeroed = bl_bwd_dq16_zeroed(writers, with_claims);
    if (!light) {
        /* the fp32 accumulator's tile: dq is written by the conversion, not zeroed here */
        EXPECT(!zeroed, "writers %u (heavy), claims %d: zeroed", writers, (int)with_claims);
        return;
    }
    if (writers == 0) {
        EXPECT(zeroed, "a light tile without entries, claims %d: not zeroed", (int)with_claims);
        return;
    }
    const bool claimed = with_claims && bl_bwd_dq16_claimed(writers);
    unsigned stores = 0;
    for (unsigned i = 0; i < writers; ++i) {
        const unsigned before = claimed ? i : 0u;  /* the claims count this entry finds */
        const bool adds = bl_bwd_dq16_adds(writers, claimed, before);
        const bool waits = bl_bwd_dq16_waits(claimed, before);
        stores += !adds;
        /* a wait needs a first claimant, who stores and publishes: only claimed entries wait */
        EXPECT(!waits || claimed, "writers %u, claims %d, entry %u: waits unclaimed", writers,
               (int)with_claims, i);
        if (adds && claimed)
            EXPECT(waits, "writers %u, entry %u: a claimed add without the wait", writers, i);
        if (adds && !claimed)
            EXPECT(zeroed, "writers %u, claims %d, entry %u: an unclaimed add onto no zeros",
                   writers, (int)with_claims, i);
        if (!adds && claimed)
            EXPECT(before == 0, "writers %u, entry %u: a later claimant stores", writers, i);
    }
    EXPECT(stores == (zeroed ? 0u : 1u), "writers %u, claims %d: %u stores onto %s", writers,
           (int)with_claims, stores, zeroed ? "zeros" : "nothing");
}

int main(void) {
    for (int with_claims = 0; with_claims < 2; ++with_claims)
        for (unsigned w = 0; w <= BL_DQ16_MAX_WRITERS + 4; ++w) check_tile(w, with_claims != 0);
    /* the rule as measured: one entry stores, several claim (head dim 128) or add onto zeros */
    EXPECT(!bl_bwd_dq16_zeroed(1, false) && !bl_bwd_dq16_zeroed(1, true), "a lone entry's zeros");
    EXPECT(bl_bwd_dq16_zeroed(2, false), "head dim 64: several entries add onto zeros");
    return test_summary("test_dq16_rule");
}
