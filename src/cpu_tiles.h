/* cpu_tiles.h -- tile geometry and the causal rule, shared by the CPU forward, backward and
 * selection. Row tiles hold BL_TILE_M query rows, key tiles BL_TILE_N keys (DESIGN §1). */
#ifndef BL_CPU_TILES_H
#define BL_CPU_TILES_H

#include <stdint.h>

#include "backlite.h"

static inline int64_t bl_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Number of keys query row i may attend to: always a prefix [0, limit) of the keys.
 * Causal is bottom-right aligned: query i sees keys j <= i + Sk - Sq. */
static inline int64_t bl_key_limit(int causal, int64_t i, int64_t Sq, int64_t Sk) {
    if (!causal) return Sk;
    int64_t limit = i + Sk - Sq + 1;
    if (limit < 0) return 0;
    return limit < Sk ? limit : Sk;
}

/* Key tiles that row tile m must visit: tiles [0, count) hold every key its rows may see
 * (the last row of the tile sees the most keys). */
static inline int64_t bl_key_tiles_visited(int causal, int64_t m, int64_t Sq, int64_t Sk) {
    int64_t last_row = (m + 1) * BL_TILE_M - 1;
    if (last_row > Sq - 1) last_row = Sq - 1;
    return bl_ceil_div(bl_key_limit(causal, last_row, Sq, Sk), BL_TILE_N);
}

/* Rows [*first, *end) of row tile m, keys [*first, *end) of key tile n. */
static inline void bl_row_tile_range(int64_t m, int64_t Sq, int64_t *first, int64_t *end) {
    *first = m * BL_TILE_M;
    *end = *first + BL_TILE_M < Sq ? *first + BL_TILE_M : Sq;
}
static inline void bl_key_tile_range(int64_t n, int64_t Sk, int64_t *first, int64_t *end) {
    *first = n * BL_TILE_N;
    *end = *first + BL_TILE_N < Sk ? *first + BL_TILE_N : Sk;
}

#endif /* BL_CPU_TILES_H */
