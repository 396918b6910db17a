/* test_pp_block_order.c -- the order of the dq accumulator's conversion blocks
 * (src/cuda/pp_block_order.h, the function the CUDA conversions and the DIRECT conversion's part
 * test call): over a grid of B x Hq x tiles CTAs every (b, h, m) block must be taken exactly once
 * -- a block taken twice and one never taken would leave dq rows unwritten -- for head counts
 * that are multiples of the head group, of 2 only, and odd; and the first block taken must be the
 * last batch's last row tile of a head in the last group (the reverse of the main kernels' order,
 * the point of the order). */
#include <stdlib.h>

#include "check.h"
#include "cuda/pp_block_order.h"

static void check_grid(int batch, int heads, int tiles) {
    const int blocks = batch * heads * tiles;
    unsigned char *seen = calloc((size_t)blocks, 1);
    if (!seen) {
        EXPECT(0, "out of memory for %d blocks", blocks);
        return;
    }
    for (int blk = 0; blk < blocks; ++blk) {
        int b = -1, h = -1, m = -1;
        bl_pp_block_coords(batch, heads, tiles, blk, &b, &h, &m);
        const int in_range = b >= 0 && b < batch && h >= 0 && h < heads && m >= 0 && m < tiles;
        EXPECT(in_range, "B %d Hq %d tiles %d: block %d -> (%d, %d, %d) out of range", batch, heads,
               tiles, blk, b, h, m);
        if (!in_range) continue;
        const int at = (b * heads + h) * tiles + m;
        EXPECT(!seen[at], "B %d Hq %d tiles %d: (%d, %d, %d) taken twice (block %d)", batch, heads,
               tiles, b, h, m, blk);
        seen[at] = 1;
    }
    for (int at = 0; at < blocks; ++at)
        EXPECT(seen[at], "B %d Hq %d tiles %d: block (%d, %d, %d) never taken", batch, heads, tiles,
               at / (heads * tiles), (at / tiles) % heads, at % tiles);
    free(seen);
    int b, h, m;
    bl_pp_block_coords(batch, heads, tiles, 0, &b, &h, &m);
    EXPECT(b == batch - 1 && h >= heads - BL_PP_HEAD_GROUP && m == tiles - 1,
           "B %d Hq %d tiles %d: the first block is (%d, %d, %d), not among the last", batch, heads,
           tiles, b, h, m);
}

int main(void) {
    static const int batches[] = {1, 2, 3};
    static const int heads[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 40};
    static const int tiles[] = {1, 2, 7, 128};
    for (size_t i = 0; i < sizeof batches / sizeof *batches; ++i)
        for (size_t j = 0; j < sizeof heads / sizeof *heads; ++j)
            for (size_t k = 0; k < sizeof tiles / sizeof *tiles; ++k)
                check_grid(batches[i], heads[j], tiles[k]);
    return test_summary("test_pp_block_order");
}
