/* reference.c -- float64 reference of DESIGN §1 (see reference.h). Slow and simple on purpose. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t ref_num_tiles_m(const ref_problem *p) { return (p->Sq + p->tile_m - 1) / p->tile_m; }
int64_t ref_num_tiles_n(const ref_problem *p) { return (p->Sk + p->tile_n - 1) / p->tile_n; }

int ref_allowed(const ref_problem *p, int64_t i, int64_t j) {
    return !p->causal || j <= i + p->Sk - p->Sq;
}

static int64_t idx_q(const ref_problem *p, int64_t b, int64_t i, int64_t h) {
    return ((b * p->Sq + i) * p->Hq + h) * p->D;
}
static int64_t idx_k(const ref_problem *p, int64_t b, int64_t j, int64_t hk) {
    return ((b * p->Sk + j) * p->Hk + hk) * p->D;
}

/* Scores of row (b, h, i) against every key, -inf where not allowed. Returns 1 if any allowed. */
static int row_scores(const ref_problem *p, const double *q, const double *k, int64_t b,
                      int64_t h, int64_t i, double *s) {
    int64_t hk = h / (p->Hq / p->Hk);
    int any = 0;
    for (int64_t j = 0; j < p->Sk; ++j) {
        if (!ref_allowed(p, i, j)) {
            s[j] = -INFINITY;
            continue;
        }
        double dot = 0.0;
        const double *qi = q + idx_q(p, b, i, h), *kj = k + idx_k(p, b, j, hk);
        for (int64_t e = 0; e < p->D; ++e) dot += qi[e] * kj[e];
        s[j] = p->scale * dot;
        any = 1;
    }
    return any;
}

/* Turns scores into probabilities in place; returns the log-sum-exp (max-shifted, in double). */
static double softmax_in_place(const ref_problem *p, double *s) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < p->Sk; ++j)
        if (s[j] > mx) mx = s[j];
    double sum = 0.0;
    for (int64_t j = 0; j < p->Sk; ++j) sum += exp(s[j] - mx);
    for (int64_t j = 0; j < p->Sk; ++j) s[j] = exp(s[j] - mx) / sum;
    return mx + log(sum);
}

void ref_forward(const ref_problem *p, const double *q, const double *k, const double *v,
                 double *out, double *lse, double *W) {
    const int64_t Tm = ref_num_tiles_m(p), Tn = ref_num_tiles_n(p);
    double *s = malloc(sizeof(double) * p->Sk);
    if (W) memset(W, 0, sizeof(double) * p->B * p->Hq * Tm * Tn);
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t hk = h / (p->Hq / p->Hk);
            for (int64_t i = 0; i < p->Sq; ++i) {
                double *o = out + idx_q(p, b, i, h);
                double *l = lse + (b * p->Hq + h) * p->Sq + i;
                if (!row_scores(p, q, k, b, h, i, s)) {
                    for (int64_t e = 0; e < p->D; ++e) o[e] = 0.0;
                    *l = -INFINITY;
                    continue;
                }
                *l = softmax_in_place(p, s);
                for (int64_t e = 0; e < p->D; ++e) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < p->Sk; ++j) acc += s[j] * v[idx_k(p, b, j, hk) + e];
                    o[e] = acc;
                }
                if (W)
                    for (int64_t j = 0; j < p->Sk; ++j)
                        W[((b * p->Hq + h) * Tm + i / p->tile_m) * Tn + j / p->tile_n] += s[j];
            }
        }
    free(s);
}

void ref_select(const ref_problem *p, const float *W, double negl_prob, uint8_t *keep) {
    const int64_t Tm = ref_num_tiles_m(p), Tn = ref_num_tiles_n(p);
    int64_t *order = malloc(sizeof(int64_t) * Tn);
    double *share = malloc(sizeof(double) * Tn);
    for (int64_t row = 0; row < p->B * p->Hq * Tm; ++row) {
        const float *w = W + row * Tn;
        uint8_t *kp = keep + row * Tn;
        double total = 0.0;
        for (int64_t n = 0; n < Tn; ++n) total += w[n];
        if (isnan(total) || isinf(total)) {
            for (int64_t n = 0; n < Tn; ++n) kp[n] = 1;
            continue;
        }
        if (total == 0.0) {
            for (int64_t n = 0; n < Tn; ++n) kp[n] = 0;
            continue;
        }
        /* insertion sort by (share, index): stable, and the indices arrive ascending */
        for (int64_t n = 0; n < Tn; ++n) {
            share[n] = w[n] / total;
            int64_t pos = n;
            while (pos > 0 && share[order[pos - 1]] > share[n]) {
                order[pos] = order[pos - 1];
                --pos;
            }
            order[pos] = n;
            kp[n] = 1;
        }
        double cum = 0.0;
        for (int64_t t = 0; t < Tn; ++t) {
            cum += share[order[t]];
            if (cum >= negl_prob) break;
            kp[order[t]] = 0;
        }
    }
    free(order);
    free(share);
}

void ref_backward(const ref_problem *p, const double *q, const double *k, const double *v,
                  const double *out, const double *dout, const uint8_t *keep, double *dq,
                  double *dk, double *dv) {
    const int64_t Tm = ref_num_tiles_m(p), Tn = ref_num_tiles_n(p);
    const int64_t D = p->D;
    double *s = malloc(sizeof(double) * p->Sk);
    memset(dq, 0, sizeof(double) * p->B * p->Sq * p->Hq * D);
    memset(dk, 0, sizeof(double) * p->B * p->Sk * p->Hk * D);
    memset(dv, 0, sizeof(double) * p->B * p->Sk * p->Hk * D);
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t hk = h / (p->Hq / p->Hk);
            for (int64_t i = 0; i < p->Sq; ++i) {
                if (!row_scores(p, q, k, b, h, i, s)) continue; /* no keys: no gradient */
                softmax_in_place(p, s);
                const double *dO = dout + idx_q(p, b, i, h);
                const double *o = out + idx_q(p, b, i, h);
                double dlt = 0.0;
                for (int64_t e = 0; e < D; ++e) dlt += dO[e] * o[e];
                for (int64_t j = 0; j < p->Sk; ++j) {
                    if (!ref_allowed(p, i, j)) continue;
                    if (keep && !keep[((b * p->Hq + h) * Tm + i / p->tile_m) * Tn + j / p->tile_n])
                        continue;
                    const double *kj = k + idx_k(p, b, j, hk);
                    const double *vj = v + idx_k(p, b, j, hk);
                    double dp = 0.0;
                    for (int64_t e = 0; e < D; ++e) dp += dO[e] * vj[e];
                    const double ds = s[j] * (dp - dlt);
                    for (int64_t e = 0; e < D; ++e) {
                        dv[idx_k(p, b, j, hk) + e] += s[j] * dO[e];
                        dk[idx_k(p, b, j, hk) + e] += p->scale * ds * q[idx_q(p, b, i, h) + e];
                        dq[idx_q(p, b, i, h) + e] += p->scale * ds * kj[e];
                    }
                }
            }
        }
    free(s);
}
