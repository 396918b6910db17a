/* cpu_select.h -- the selection rule for one row tile (src/select.c). */
#ifndef BL_CPU_SELECT_H
#define BL_CPU_SELECT_H

#include <stdint.h>

/* A key tile's share p_n of its row tile's mass, and its index n (the tie-break). */
typedef struct bl_tile_share {
    double p;
    int64_t n;
} bl_tile_share;

/* w: (Tn) tile masses of one row tile -> keep: (Tn), 1 = compute, 0 = skip.
 * scratch: room for Tn entries. negl_prob in [0, 1). */
void bl_select_row_tile(const float *w, int64_t num_tiles_n, double negl_prob, uint8_t *keep,
                        bl_tile_share *scratch);

#endif /* BL_CPU_SELECT_H */
