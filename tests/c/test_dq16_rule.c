/* test_dq16_rule.c -- the DIRECT form's rule for light dq row tiles (src/cuda/dq16_rule.h, the
 * functions the CUDA kernels call): for every entry count a tile can have, with claims (version
 * 10 at head dim 128) and without (head dim 64), the tile's entries, taken in their claim order,
 * must leave exactly one writer that starts the tile -- the zero CTAs or a single store -- and
 * every other entry must add after it: an unclaimed add only onto zeros, a claimed add only
 * after waiting for the first claimant's store. (Two forms of a gate on the claims broke this
 * before their first run: bench/notes-bwd.md, hundred-and-twenty-fourth session.) And who
 * zeroes the fp32 accumulator beside it (check_accum_zeros). */
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

/* The fp32 accumulator's zeros where the DIRECT form may run (head dim 128): every row a call
 * reads is zeroed, for every way the row CTAs over a tile's rows and the tile's zero CTA can have
 * read the device's pick -- nothing yet, or the call's own (it is written once a call, after the
 * lists kernel's reset). With DIRECT picked only a heavy tile's rows are read; with the
 * accumulator's kernels all of it, in a layout the zero CTAs' tile rows need not match, so there
 * only the row CTAs count. (The first committed form zeroed, in a zero CTA that read nothing yet,
 * an even share of the whole accumulator instead of its own tiles' rows: with its tile's row CTAs
 * and the share's zero CTA reading DIRECT, a heavy tile's rows stayed unzeroed.) */
static void check_accum_zeros(unsigned writers) {
    for (int direct = 0; direct < 2; ++direct)
        for (int rows_read = 0; rows_read < 2; ++rows_read)
            for (int zero_read = 0; zero_read < 2; ++zero_read) {
                const bool read = direct ? writers != 0 && !bl_bwd_dq16_tile(writers) : true;
                bool zeroed = bl_bwd_rows_zero_accum(rows_read && direct);
                if (direct)
                    zeroed = zeroed || bl_bwd_zero_cta_zeroes_accum(zero_read != 0, zero_read != 0,
                                                                    zero_read ? writers : 0u);
                EXPECT(!read || zeroed,
                       "writers %u, pick %s, row CTAs read %s, zero CTA read %s: rows read unzeroed",
                       writers, direct ? "DIRECT" : "accumulator", rows_read ? "it" : "nothing",
                       zero_read ? "it" : "nothing");
            }
}

int main(void) {
    for (int with_claims = 0; with_claims < 2; ++with_claims)
        for (unsigned w = 0; w <= BL_DQ16_MAX_WRITERS + 4; ++w) check_tile(w, with_claims != 0);
    for (unsigned w = 0; w <= BL_DQ16_MAX_WRITERS + 4; ++w) check_accum_zeros(w);
    /* the rule as measured: one entry stores, several claim (head dim 128) or add onto zeros */
    EXPECT(!bl_bwd_dq16_zeroed(1, false) && !bl_bwd_dq16_zeroed(1, true), "a lone entry's zeros");
    EXPECT(bl_bwd_dq16_zeroed(2, false), "head dim 64: several entries add onto zeros");
    return test_summary("test_dq16_rule");
}
