/* reference.h -- a plainly written float64 implementation of DESIGN §1, for the C tests.
 *
 * Written from the contract, not from the library: no tiles in the math (tiles appear only as the
 * grouping of W and masks), no online softmax, every sum in double. All tensors here are dense
 * double arrays: q, out, dout, dq: (B, Sq, Hq, D); k, v, dk, dv: (B, Sk, Hk, D);
 * lse: (B, Hq, Sq); W, masks: (B, Hq, Tm, Tn).
 */
#ifndef BL_TEST_REFERENCE_H
#define BL_TEST_REFERENCE_H

#include <stdint.h>

typedef struct ref_problem {
    int64_t B, Sq, Sk, Hq, Hk, D;
    double scale;
    int causal;
    int64_t tile_m, tile_n; /* TM, TN */
} ref_problem;

int64_t ref_num_tiles_m(const ref_problem *p);
int64_t ref_num_tiles_n(const ref_problem *p);
/* 1 if query i may attend to key j. */
int ref_allowed(const ref_problem *p, int64_t i, int64_t j);

/* Exact forward: out, lse (-inf for rows without keys) and the tile mass W (W may be NULL). */
void ref_forward(const ref_problem *p, const double *q, const double *k, const double *v,
                 double *out, double *lse, double *W);

/* Selection for every (b, h, m): W (B, Hq, Tm, Tn) -> keep (B, Hq, Tm, Tn). */
void ref_select(const ref_problem *p, const float *W, double negl_prob, uint8_t *keep);

/* Backward over the tiles with keep != 0 (keep NULL: all tiles). `out` is the forward output the
 * caller hands to the library (Dlt is computed from it); lse is recomputed exactly here. */
void ref_backward(const ref_problem *p, const double *q, const double *k, const double *v,
                  const double *out, const double *dout, const uint8_t *keep, double *dq,
                  double *dk, double *dv);

#endif /* BL_TEST_REFERENCE_H */
