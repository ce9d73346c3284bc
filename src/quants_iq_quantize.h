/* Quantizers of the grid i-quants, byte-identical with ggml_quantize_chunk (ggml-quants.c,
 * quantize_row_iq*_impl), with and without importance weights.
 *
 * Each sub-block is fitted by a scale search: for a range of trial scales, every group of D
 * quants (D = 8 for IQ2, 4 for IQ3) is rounded to levels 0..kMaxQ-1 (values 2l + 1); a group
 * that is no grid point is replaced by its best grid neighbour, the nearest points of the grid
 * to it, which ggml lists once per grid (iq2xs_init_impl / iq3xs_init_impl: the points of the
 * first `nwant` distances, in order of distance then index). gguflm builds the same lists,
 * once, on first use (gguflm_iq_qgrid_init; the Python entry points call it with the GIL held).
 * Byte identity needs ggml's float operations in ggml's order: this file keeps its expression
 * shapes, and like quants_ref.h it is compiled without FMA contraction.
 */
#ifndef GGUFLM_QUANTS_IQ_QUANTIZE_H
#define GGUFLM_QUANTS_IQ_QUANTIZE_H

#include <stdlib.h>
#include "quants_iq_dot.h"

/* the quantizer's view of a grid: levels per point, the map from packed levels to a point (or,
 * negative, to a neighbour list), and the neighbour lists (count, then point indices) */
typedef struct {
    int n, dims, bits;          /* points, quants per point, bits per packed level */
    int8_t *level;              /* [n][dims] levels 0..7 */
    int *map;                   /* packed levels -> point index, or -(offset + 1) into neighbours */
    uint16_t *neighbours;
} gguflm_iq_qgrid;

enum { GGUFLM_QGRID_IQ2_XXS, GGUFLM_QGRID_IQ2_XS, GGUFLM_QGRID_IQ2_S, GGUFLM_QGRID_IQ1, GGUFLM_QGRID_IQ3_XXS,
       GGUFLM_QGRID_IQ3_S, GGUFLM_QGRID_COUNT };

static gguflm_iq_qgrid gguflm_iq_qgrids[GGUFLM_QGRID_COUNT];

static inline int gguflm_iq_qgrid_of(int type) {
    switch (type) {
    case GGUFLM_IQ2_XXS: return GGUFLM_QGRID_IQ2_XXS;
    case GGUFLM_IQ2_XS: return GGUFLM_QGRID_IQ2_XS;
    case GGUFLM_IQ2_S: return GGUFLM_QGRID_IQ2_S;
    case GGUFLM_IQ1_S:
    case GGUFLM_IQ1_M: return GGUFLM_QGRID_IQ1;
    case GGUFLM_IQ3_XXS: return GGUFLM_QGRID_IQ3_XXS;
    case GGUFLM_IQ3_S: return GGUFLM_QGRID_IQ3_S;
    default: return -1;
    }
}

/* the level of one dequantization grid byte: IQ2 grids hold 8, 25, 43 for levels 0..2; IQ1 -1, 0,
 * 1; IQ3_XXS 4, 12, ..., 52, 62 for 0..7; IQ3_S 1, 3, ..., 15 */
static inline int gguflm_iq_level(int q, uint8_t v) {
    if (q == GGUFLM_QGRID_IQ1) return (int8_t)v + 1;
    if (q <= GGUFLM_QGRID_IQ2_S) return v == 0x08 ? 0 : v == 0x19 ? 1 : 2;
    if (q == GGUFLM_QGRID_IQ3_XXS) return v == 62 ? 7 : (v - 4) / 8;
    return (v - 1) / 2;
}

/* build grid q's map and neighbour lists (once; callers on several threads wait for the first);
 * 0, or -1 when out of memory */
static int gguflm_iq_qgrid_build(int q);
static int gguflm_iq_qgrid_init(int q) {
    static char lock;
    if (__atomic_load_n(&gguflm_iq_qgrids[q].map, __ATOMIC_ACQUIRE)) return 0;
    while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {}
    const int rc = __atomic_load_n(&gguflm_iq_qgrids[q].map, __ATOMIC_ACQUIRE) ? 0 : gguflm_iq_qgrid_build(q);
    __atomic_clear(&lock, __ATOMIC_RELEASE);
    return rc;
}

static int gguflm_iq_qgrid_build(int q) {
    gguflm_iq_qgrid *g = &gguflm_iq_qgrids[q];
    static const int sizes[] = {256, 512, 1024, 2048, 256, 512}, nwants[] = {2, 2, 1, 3, 2, 3};
    const int n = sizes[q], nwant = nwants[q], dims = q <= GGUFLM_QGRID_IQ1 ? 8 : 4, bits = dims == 8 ? 2 : 3;
    const int map_size = dims == 8 ? 43692 : 4096;  /* ggml's kmap_size: every packing of levels <= 2 (IQ2), <= 7 (IQ3) */
    int8_t *level = malloc((size_t)n * dims);
    int *map = malloc(sizeof(int) * map_size), *dist = malloc(sizeof(int) * n), *count = calloc(8 * 7 * 7 * 8 + 1, sizeof(int));
    if (!level || !map || !dist || !count) goto fail;
    for (int p = 0; p < n; ++p) {
        for (int i = 0; i < dims; ++i) {
            const uint8_t v = q == GGUFLM_QGRID_IQ2_XXS ? (uint8_t)(gguflm_iq2xxs_grid[p] >> (8 * i))
                            : q == GGUFLM_QGRID_IQ2_XS ? (uint8_t)(gguflm_iq2xs_grid[p] >> (8 * i))
                            : q == GGUFLM_QGRID_IQ2_S ? (uint8_t)(gguflm_iq2s_grid[p] >> (8 * i))
                            : q == GGUFLM_QGRID_IQ1 ? (uint8_t)(gguflm_iq1s_grid[p] >> (8 * i))
                            : q == GGUFLM_QGRID_IQ3_XXS ? (uint8_t)(gguflm_iq3xxs_grid[p] >> (8 * i))
                            : (uint8_t)(gguflm_iq3s_grid[p] >> (8 * i));
            level[p * dims + i] = (int8_t)gguflm_iq_level(q, v);
        }
    }
    for (int u = 0; u < map_size; ++u) map[u] = -1;
    for (int p = 0; p < n; ++p) {
        int u = 0;
        for (int i = 0; i < dims; ++i) u |= level[p * dims + i] << (bits * i);
        map[u] = p;
    }
    /* two passes over the points off the grid: count the lists, then fill them */
    const int max_d2 = dims * 14 * 14;
    int64_t total = 0;
    uint16_t *nb = NULL;
    for (int pass = 0; pass < 2; ++pass) {
        int64_t at = 0;
        for (int u = 0; u < map_size; ++u) {
            if (map[u] >= 0) continue;
            /* squared distances of the positions 2l + 1 to every grid point */
            memset(count, 0, sizeof(int) * (max_d2 + 1));
            for (int p = 0; p < n; ++p) {
                int d2 = 0;
                for (int i = 0; i < dims; ++i) {
                    const int diff = 2 * (level[p * dims + i] - ((u >> (bits * i)) & ((1 << bits) - 1)));
                    d2 += diff * diff;
                }
                dist[p] = d2;
                ++count[d2];
            }
            /* the first nwant distances, and the points at them in order of distance, then index */
            int limit = -1, have = 0, len = 0;
            for (int d2 = 0; d2 <= max_d2 && have < nwant; ++d2)
                if (count[d2]) { limit = d2; ++have; len += count[d2]; }
            if (pass == 0) { total += 1 + len; continue; }
            map[u] = -(int)(at + 1);
            nb[at++] = (uint16_t)len;
            for (int d2 = 0; d2 <= limit; ++d2) {
                if (!count[d2]) continue;
                for (int p = 0; p < n; ++p) if (dist[p] == d2) nb[at++] = (uint16_t)p;
            }
        }
        if (pass == 0) {
            nb = malloc(sizeof(uint16_t) * (size_t)(total > 0 ? total : 1));
            if (!nb) goto fail;
        }
    }
    free(dist);
    free(count);
    g->n = n, g->dims = dims, g->bits = bits, g->level = level, g->neighbours = nb;
    __atomic_store_n(&g->map, map, __ATOMIC_RELEASE);  /* published last: readers test map */
    return 0;
fail:
    free(level), free(map), free(dist), free(count);
    return -1;
}

/* ggml's iq2/iq3_find_best_neighbour: the listed point nearest to xval at this scale, weighted;
 * its levels into L */
static int gguflm_iq_best_neighbour(const gguflm_iq_qgrid *g, const uint16_t *list, const float *xval,
                                    const float *weight, float scale, int8_t *L) {
    float best_d2 = FLT_MAX;
    int best = list[1];
    for (int j = 1; j <= list[0]; ++j) {
        const int8_t *pl = g->level + list[j] * g->dims;
        float d2 = 0;
        for (int i = 0; i < g->dims; ++i) {
            float q = 2 * pl[i] + 1;
            float diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = list[j];
        }
    }
    for (int i = 0; i < g->dims; ++i) L[i] = g->level[best * g->dims + i];
    return best;
}

/* the grid point of D levels L (rounded from xval at inverse scale id when id != 0; its nearest
 * listed neighbour at `scale` when they are no point); *on_grid: they were one */
static int gguflm_iq_point(const gguflm_iq_qgrid *g, int kmax, float id, float scale, const float *xval,
                           const float *waux, int8_t *L, bool *on_grid) {
    int u = 0;
    for (int i = 0; i < g->dims; ++i) {
        int l = gguflm_nearest_int(0.5f * (id * xval[i] - 1));
        l = GGUFLM_MAX(0, GGUFLM_MIN(kmax - 1, l));
        L[i] = (int8_t)l;
        u |= l << (g->bits * i);
    }
    int p = g->map[u];
    *on_grid = p >= 0;
    if (p < 0) p = gguflm_iq_best_neighbour(g, g->neighbours - g->map[u] - 1, xval, waux, scale, L);
    return p;
}

/* What a type's sub-block search does differently (ggml's constants) */
typedef struct {
    int gs;                 /* elements per sub-block (one scale) */
    int is_max;             /* trial scales (2 kMaxQ - 1 + is * step) / max for |is| <= is_max */
    float step;
    float eps;              /* sub-blocks whose max is below are zero (IQ3_S: max == 0) */
    bool parity;            /* an even number of minus signs per 8 (IQ3_XXS, IQ2_XXS, IQ2_XS) */
    bool refit_all;         /* the final fit re-rounds every group, not just those off the grid */
    bool qp_start;          /* IQ2_XXS: trials around make_qp_quants' scale, then always a refit */
} gguflm_iq_search;

/* ggml's make_qp_quants: a scale for levels 0..nmax by weighted least squares, from the best of
 * 9 trial scales, then up to 5 rounds of moving single levels. L is uint8 as in ggml (a negative
 * level, from a flipped sign, wraps). The K-quants' importance-weighted quantizers use it too. */
static float gguflm_make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = GGUFLM_MAX(max, x[i]);
    if (max < GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)gguflm_nearest_int(iscale * x[i]);
    float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * L[i];
        float w = quant_weights[i];
        best_mse += w * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = gguflm_nearest_int(iscale_is * x[i]);
            l = GGUFLM_MIN(nmax, l);
            float diff = x[i] - scale_is * l;
            float w = quant_weights[i];
            mse += w * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0;
    float suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = gguflm_nearest_int(iscale * x[i]);
        l = GGUFLM_MIN(nmax, l);
        L[i] = (uint8_t)l;
        float w = quant_weights[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = quant_weights[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = gguflm_nearest_int(x[i] * sl2 / slx);
                new_l = GGUFLM_MIN(nmax, new_l);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* one sub-block of gs elements: xval = |x| (parity: the cheapest one flipped), signs per 8, the
 * fitted scale (-1: too small, nothing to write) and the grid points of its groups */
static float gguflm_iq_fit(const gguflm_iq_qgrid *g, const gguflm_iq_search *s, int kmax, const float *xb,
                           const float *weight, uint8_t *signs, int *points) {
    const int gs = s->gs, D = g->dims, ng = gs / D;
    float xval[32] = {0}, waux[32];  /* every xval[i < gs] is set below (gs is 16 or 32); zeroed for GCC's sake */
    int8_t L[32], Laux[32];
    bool on_grid[8], on_grid_aux[8];
    for (int i = 0; i < gs; ++i) waux[i] = sqrtf(weight[i]);
    for (int k = 0; k < gs / 8; ++k) {
        int nflip = 0;
        uint8_t sg = 0;
        for (int i = 0; i < 8; ++i) {
            if (xb[8 * k + i] >= 0) xval[8 * k + i] = xb[8 * k + i];
            else { xval[8 * k + i] = -xb[8 * k + i]; ++nflip; sg |= (uint8_t)(1 << i); }
        }
        if (s->parity && nflip % 2) {
            int imin = 0;
            float min = weight[8 * k + imin] * xb[8 * k + imin] * xb[8 * k + imin];
            for (int i = 1; i < 8; ++i) {
                float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) { min = ax; imin = i; }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            sg ^= (uint8_t)(1 << imin);
        }
        signs[k] = s->parity ? sg & 127 : sg;
    }
    float max = xval[0];
    for (int i = 1; i < gs; ++i) max = GGUFLM_MAX(max, xval[i]);
    memset(L, 0, sizeof(L));
    if (s->eps > 0 ? max < s->eps : !max) return -1.0f;
    float best = 0;
    float scale = max / (2 * kmax - 1);
    if (s->qp_start) {
        scale = gguflm_make_qp_quants(gs, kmax + 1, xval, (uint8_t *)L, weight);
        max = scale * kmax;  /* ggml's eff_max: the trials go around it */
        if (max <= 0) return -1.0f;
    }
    for (int k = 0; k < ng; ++k) on_grid[k] = !s->refit_all;
    for (int is = -s->is_max; is <= s->is_max; ++is) {
        float id = (2 * kmax - 1 + is * s->step) / max;
        float this_scale = 1 / id;
        for (int k = 0; k < ng; ++k)
            gguflm_iq_point(g, kmax, id, this_scale, xval + D * k, waux + D * k, Laux + D * k, &on_grid_aux[k]);
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < gs; ++i) {
            float w = weight[i];
            float q = 2 * Laux[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            for (int i = 0; i < gs; ++i) L[i] = Laux[i];
            for (int k = 0; k < ng; ++k) on_grid[k] = on_grid_aux[k];
        }
    }
    int n_not_ongrid = 0;
    for (int k = 0; k < ng; ++k) if (!on_grid[k]) ++n_not_ongrid;
    if ((n_not_ongrid > 0 || s->qp_start) && scale > 0) {
        float id = 1 / scale;
        for (int k = 0; k < ng; ++k) {
            if (on_grid[k] && !s->refit_all && !s->qp_start) continue;
            bool unused;
            gguflm_iq_point(g, kmax, id, scale, xval + D * k, waux + D * k, L + D * k, &unused);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < gs; ++i) {
            float w = weight[i];
            float q = 2 * L[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {
        /* ggml: "should never happen"; flip the scale and the signs */
        scale = -scale;
        for (int k = 0; k < gs / 8; ++k) signs[k] = s->parity ? (uint8_t)(~signs[k] & 127) : (uint8_t)~signs[k];
    }
    for (int k = 0; k < ng; ++k) {
        int u = 0;
        for (int i = 0; i < D; ++i) u |= L[D * k + i] << (g->bits * i);
        points[k] = g->map[u];  /* always a point: the levels come from one */
    }
    return scale;
}

/* one row of k elements of type into y; qw: ggml's quant_weights (one per column) or NULL */
static void gguflm_quantize_iq_row(int type, const float *x, void *vy, int64_t k, const float *qw) {
    const int q = gguflm_iq_qgrid_of(type);
    const gguflm_iq_qgrid *g = &gguflm_iq_qgrids[q];
    const int kmax = g->dims == 8 ? 3 : 8;
    gguflm_iq_search s;
    switch (type) {
    case GGUFLM_IQ2_XXS: s = (gguflm_iq_search){32, 6, 0.1f, GROUP_MAX_EPS, true, true, true}; break;
    case GGUFLM_IQ2_XS: s = (gguflm_iq_search){16, 9, 0.1f, GROUP_MAX_EPS, true, false, false}; break;
    case GGUFLM_IQ3_XXS: s = (gguflm_iq_search){32, 15, 0.2f, 1e-8f, true, false, false}; break;
    case GGUFLM_IQ3_S: s = (gguflm_iq_search){32, 9, 0.2f, 0.0f, false, true, false}; break;
    default: s = (gguflm_iq_search){16, 9, 0.1f, 1e-8f, false, false, false}; break;  /* IQ2_S */
    }
    const int nsub = QK_K / s.gs;
    const size_t bytes = type == GGUFLM_IQ2_XXS ? sizeof(block_iq2_xxs) : type == GGUFLM_IQ2_XS ? sizeof(block_iq2_xs)
                       : type == GGUFLM_IQ3_XXS ? sizeof(block_iq3_xxs) : type == GGUFLM_IQ3_S ? sizeof(block_iq3_s)
                       : sizeof(block_iq2_s);
    const bool two_bit_xs = type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ2_XS;  /* no fudge, sigma2 halved */
    for (int64_t ibl = 0; ibl < k / QK_K; ++ibl) {
        uint8_t *blk = (uint8_t *)vy + ibl * bytes;
        memset(blk, 0, bytes);
        const float *xbl = x + QK_K * ibl;
        float sumx2 = 0;
        for (int i = 0; i < QK_K; ++i) sumx2 += xbl[i] * xbl[i];
        float sigma2 = two_bit_xs ? sumx2 / QK_K : 2 * sumx2 / QK_K;
        float scales[QK_K / 16], max_scale = 0;
        int iq3s_packed = 0;  /* IQ3_S: sub-blocks written so far (ggml's qs/signs pointers) */
        for (int ib = 0; ib < nsub; ++ib) {
            const float *xb = xbl + s.gs * ib;
            float weight[32];
            if (qw) {
                const float *w = qw + QK_K * ibl + s.gs * ib;
                for (int i = 0; i < s.gs; ++i) weight[i] = w[i] * sqrtf(sigma2 + xb[i] * xb[i]);
            } else if (type == GGUFLM_IQ2_S) {
                for (int i = 0; i < s.gs; ++i) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
            } else {
                for (int i = 0; i < s.gs; ++i) weight[i] = xb[i] * xb[i];
            }
            uint8_t signs[4];
            int points[8];
            const float scale = gguflm_iq_fit(g, &s, kmax, xb, weight, signs, points);
            scales[ib] = scale < 0 ? 0.0f : scale;
            if (scale < 0) continue;  /* too small: the sub-block writes nothing */
            if (type == GGUFLM_IQ2_XXS) {
                uint8_t *w = blk + 2 + 8 * ib;  /* 4 grid indices, then the sign groups and scale */
                for (int j = 0; j < 4; ++j) w[j] = (uint8_t)points[j];
                const uint32_t ss = signs[0] | (signs[1] << 7) | (signs[2] << 14) | ((uint32_t)signs[3] << 21);
                memcpy(w + 4, &ss, 4);
            } else if (type == GGUFLM_IQ2_XS) {
                block_iq2_xs *b = (block_iq2_xs *)blk;
                for (int j = 0; j < 2; ++j) b->qs[2 * ib + j] = (uint16_t)(points[j] | (signs[j] << 9));
            } else if (type == GGUFLM_IQ3_XXS) {
                block_iq3_xxs *b = (block_iq3_xxs *)blk;
                for (int j = 0; j < 8; ++j) b->qs[8 * ib + j] = (uint8_t)points[j];
                const uint32_t ss = signs[0] | (signs[1] << 7) | (signs[2] << 14) | ((uint32_t)signs[3] << 21);
                memcpy(b->qs + QK_K / 4 + 4 * ib, &ss, 4);
            } else if (type == GGUFLM_IQ3_S) {
                block_iq3_s *b = (block_iq3_s *)blk;
                for (int j = 0; j < 8; ++j) {
                    b->qs[8 * iq3s_packed + j] = (uint8_t)(points[j] & 255);
                    b->qh[(ib * 8 + j) / 8] |= (uint8_t)((points[j] >> 8) << ((ib * 8 + j) % 8));
                }
                memcpy(b->signs + 4 * iq3s_packed, signs, 4);
                ++iq3s_packed;
            } else {
                block_iq2_s *b = (block_iq2_s *)blk;
                for (int j = 0; j < 2; ++j) {
                    const int i8 = 2 * ib + j;
                    b->qs[i8] = (uint8_t)(points[j] & 255);
                    b->qh[i8 / 4] |= (uint8_t)((points[j] >> 8) << 2 * (i8 % 4));
                    b->qs[QK_K / 8 + i8] = signs[j];
                }
            }
            max_scale = GGUFLM_MAX(max_scale, scale);
        }
        if (!max_scale) {
            /* IQ3_S and IQ2_S keep their points, with d = 0 */
            if (type != GGUFLM_IQ3_S && type != GGUFLM_IQ2_S) memset(blk, 0, bytes);
            continue;
        }
        float d = max_scale / 31;
        const float fudge = type == GGUFLM_IQ3_XXS ? 1.0125f : type == GGUFLM_IQ3_S ? 1.033f : 0.9875f;
        const ggml_half dh = gguflm_fp32_to_fp16(two_bit_xs ? d : d * fudge);
        memcpy(blk, &dh, 2);
        float id = 1 / d;
        for (int ib = 0; ib < nsub; ++ib) {
            int l = gguflm_nearest_int(0.5f * (id * scales[ib] - 1));
            l = GGUFLM_MAX(0, GGUFLM_MIN(15, l));
            if (type == GGUFLM_IQ2_XXS) {
                blk[2 + 8 * ib + 7] |= (uint8_t)(l << 4);
            } else if (type == GGUFLM_IQ2_XS) {
                ((block_iq2_xs *)blk)->scales[ib / 2] |= (uint8_t)(l << (4 * (ib % 2)));
            } else if (type == GGUFLM_IQ3_XXS) {
                uint8_t *w = ((block_iq3_xxs *)blk)->qs + QK_K / 4 + 4 * ib;
                w[3] |= (uint8_t)(l << 4);
            } else if (type == GGUFLM_IQ3_S) {
                ((block_iq3_s *)blk)->scales[ib / 2] |= (uint8_t)(l << (4 * (ib % 2)));
            } else {
                ((block_iq2_s *)blk)->scales[ib / 2] |= (uint8_t)(l << (4 * (ib % 2)));
            }
        }
    }
}


/* ======================= IQ1_S, IQ1_M ======================= */

/* ggml's iq1_find_best_neighbour2: the listed point nearest to xval at this scale, its levels
 * valued xg[level] (the grid values shifted by the delta) */
static int gguflm_iq1_best_neighbour(const gguflm_iq_qgrid *g, const uint16_t *list, const float *xval,
                                     const float *weight, float scale, const float *xg, int8_t *L) {
    float best_score = FLT_MAX;
    int best = -1;
    for (int j = 1; j <= list[0]; ++j) {
        const int8_t *pl = g->level + list[j] * 8;
        float d2 = 0;
        for (int i = 0; i < 8; ++i) {
            float q = xg[pl[i]];
            float w = weight[i];
            float diff = scale * q - xval[i];
            d2 += w * diff * diff;
        }
        if (d2 < best_score) {
            best_score = d2;
            best = list[j];
        }
    }
    /* ggml falls back to a scan of the whole grid when every distance is inf or NaN (reading past
     * xval there); finite rows never get there */
    if (best < 0) best = list[1];
    for (int i = 0; i < 8; ++i) L[i] = g->level[best * 8 + i];
    return best;
}

/* the elements of a sub-block in ascending order, ties in index order (glibc's qsort, a merge sort
 * for arrays this small, keeps them) */
static void gguflm_iq1_sort(const float *xb, int n, int *idx) {
    for (int j = 0; j < n; ++j) {
        int i = j;
        while (i > 0 && xb[idx[i - 1]] > xb[j]) { idx[i] = idx[i - 1]; --i; }
        idx[i] = j;
    }
}

/* IQ1_S (qw required) and IQ1_M rows: each sub-block's quants split into three runs of the
 * sorted elements (-1, 0, 1, plus or minus the delta) by an exhaustive search of the two bounds */
static void gguflm_quantize_iq1_row(int type, const float *x, void *vy, int64_t k, const float *qw) {
    const gguflm_iq_qgrid *g = &gguflm_iq_qgrids[GGUFLM_QGRID_IQ1];
    const bool m = type == GGUFLM_IQ1_M;
    const int bs = m ? 16 : 32, nsub = QK_K / bs;
    const float delta = 0.125f;
    const float x_p[3] = {-1 + delta, delta, 1 + delta};
    const float x_m[3] = {-1 - delta, -delta, 1 - delta};
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    const size_t bytes = m ? sizeof(block_iq1_m) : sizeof(block_iq1_s);
    for (int64_t ibl = 0; ibl < k / QK_K; ++ibl) {
        uint8_t *blk = (uint8_t *)vy + ibl * bytes;
        memset(blk, 0, bytes);
        uint8_t *qs = m ? ((block_iq1_m *)blk)->qs : ((block_iq1_s *)blk)->qs;
        float max_scale = 0, scales[QK_K / 16], weight[32];
        int shifts[QK_K / 16];
        const float *xbl = x + QK_K * ibl;
        float sumx2 = 0;
        for (int i = 0; i < QK_K; ++i) sumx2 += xbl[i] * xbl[i];
        float sigma2 = 2 * sumx2 / QK_K;
        for (int ib = 0; ib < nsub; ++ib) {
            const float *xb = xbl + bs * ib;
            if (qw) {
                const float *w = qw + QK_K * ibl + bs * ib;
                for (int i = 0; i < bs; ++i) weight[i] = w[i] * sqrtf(sigma2 + xb[i] * xb[i]);
            } else {
                for (int i = 0; i < bs; ++i) weight[i] = xb[i] * xb[i];
            }
            float max = fabsf(xb[0]);
            for (int i = 1; i < bs; ++i) max = GGUFLM_MAX(max, fabsf(xb[i]));
            scales[ib] = 0;
            shifts[ib] = m ? 0 : 1;
            if (max < (m ? 1e-7f : 1e-12f)) continue;
            int idx[32];
            gguflm_iq1_sort(xb, bs, idx);
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_k = -1;
            if (!m) {
                float sumx[33], sumw[33];
                sumx[0] = sumw[0] = 0;
                for (int j = 0; j < bs; ++j) {
                    int i = idx[j];
                    sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                    sumw[j + 1] = sumw[j] + weight[i];
                }
                for (int i1 = 0; i1 <= bs; ++i1) {
                    for (int i2 = i1; i2 <= bs; ++i2) {
                        for (int sign = 0; sign < 2; ++sign) {
                            const float *xv = sign ? x_m : x_p;
                            float sumqx = (sumx[i1] - sumx[0]) * xv[0] + (sumx[i2] - sumx[i1]) * xv[1] + (sumx[bs] - sumx[i2]) * xv[2];
                            float sumq2 = (sumw[i1] - sumw[0]) * xv[0] * xv[0] + (sumw[i2] - sumw[i1]) * xv[1] * xv[1] +
                                          (sumw[bs] - sumw[i2]) * xv[2] * xv[2];
                            if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                                scale = sumqx / sumq2;
                                best_score = scale * sumqx;
                                besti1 = i1, besti2 = i2, best_k = sign ? 3 : 0;  /* shift -1: both halves minus */
                            }
                        }
                    }
                }
            } else {
                /* prefix sums per half of the sub-block: each half has its own delta sign */
                float px[2][17], pw[2][17];
                px[0][0] = px[1][0] = 0;
                pw[0][0] = pw[1][0] = 0;
                for (int j = 0; j < bs; ++j) {
                    const int i = idx[j], h = i < bs / 2 ? 0 : 1;
                    px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                    px[1 - h][j + 1] = px[1 - h][j];
                    pw[h][j + 1] = pw[h][j] + weight[i];
                    pw[1 - h][j + 1] = pw[1 - h][j];
                }
                const float txs[2] = {px[0][bs], px[1][bs]}, tws[2] = {pw[0][bs], pw[1][bs]};
                const float p2 = x_p[2], m2 = x_m[2];
                const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
                const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
                for (int i1 = 0; i1 <= bs; ++i1) {
                    for (int i2 = i1; i2 <= bs; ++i2) {
                        float qx_p[2], qx_m[2], q2_p[2], q2_m[2], sumqx[4], sumq2[4];
                        for (int h = 0; h < 2; ++h) {
                            const float sx = px[h][i1] + px[h][i2];
                            qx_p[h] = txs[h] * p2 - sx;
                            qx_m[h] = txs[h] * m2 - sx;
                            q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                            q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                        }
                        sumqx[0] = qx_p[0] + qx_p[1], sumqx[1] = qx_p[0] + qx_m[1];
                        sumqx[2] = qx_m[0] + qx_p[1], sumqx[3] = qx_m[0] + qx_m[1];
                        sumq2[0] = q2_p[0] + q2_p[1], sumq2[1] = q2_p[0] + q2_m[1];
                        sumq2[2] = q2_m[0] + q2_p[1], sumq2[3] = q2_m[0] + q2_m[1];
                        for (int kk = 0; kk < 4; ++kk) {
                            if (sumq2[kk] > 0 && sumqx[kk] * sumqx[kk] > best_score * sumq2[kk]) {
                                scale = sumqx[kk] / sumq2[kk];
                                best_score = scale * sumqx[kk];
                                besti1 = i1, besti2 = i2, best_k = kk;
                            }
                        }
                    }
                }
            }
            if (besti1 < 0 || besti2 < 0 || best_k < 0) continue;
            int8_t L[32];
            for (int j = 0; j < besti1; ++j) L[idx[j]] = 0;
            for (int j = besti1; j < besti2; ++j) L[idx[j]] = 1;
            for (int j = besti2; j < bs; ++j) L[idx[j]] = 2;
            if (scale < 0) {
                for (int j = 0; j < bs; ++j) L[j] = (int8_t)(2 - L[j]);
                scale = -scale;
                best_k = 3 - best_k;  /* 0 <-> 3, 1 <-> 2: every half's sign flips */
            }
            bool all_on_grid = true;
            int index[4];
            for (int kg = 0; kg < bs / 8; ++kg) {
                /* the delta sign of this group of 8: best_k's bit 1 (first half), bit 0 (second) */
                const float *xx = (kg == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
                int u = 0;
                for (int j = 0; j < 8; ++j) u |= L[8 * kg + j] << (2 * j);
                int p = g->map[u];
                if (p < 0) {
                    all_on_grid = false;
                    p = gguflm_iq1_best_neighbour(g, g->neighbours - g->map[u] - 1, xb + 8 * kg, weight + 8 * kg, scale, xx,
                                                  L + 8 * kg);
                }
                index[kg] = p;
            }
            if (!all_on_grid) {
                float sumqx = 0, sumq2 = 0;
                for (int kg = 0; kg < bs / 8; ++kg) {
                    const float *xx = (kg == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
                    const int8_t *pl = g->level + index[kg] * 8;
                    for (int j = 0; j < 8; ++j) {
                        float w = weight[8 * kg + j];
                        float q = xx[pl[j]];
                        sumqx += w * q * xb[8 * kg + j];
                        sumq2 += w * q * q;
                    }
                }
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            if (m) {
                qs[2 * ib] = (uint8_t)(index[0] & 255), qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
                ((block_iq1_m *)blk)->qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
            } else {
                uint16_t h = 0;
                for (int kg = 0; kg < 4; ++kg) {
                    qs[4 * ib + kg] = (uint8_t)(index[kg] & 255);
                    h |= (uint16_t)((index[kg] >> 8) << (3 * kg));
                }
                ((block_iq1_s *)blk)->qh[ib] = h;
            }
            scales[ib] = scale;
            shifts[ib] = m ? best_k : (best_k == 0 ? 1 : -1);
            max_scale = GGUFLM_MAX(max_scale, scale);
        }
        if (!max_scale) continue;
        float d = max_scale / 15;
        float id = 1 / d;
        if (!m) {
            block_iq1_s *b = (block_iq1_s *)blk;
            b->d = gguflm_fp32_to_fp16(d * 1.125f);
            for (int ib = 0; ib < nsub; ++ib) {
                int l = gguflm_nearest_int(0.5f * (id * scales[ib] - 1));
                l = GGUFLM_MAX(0, GGUFLM_MIN(7, l));
                if (shifts[ib] == -1) l |= 8;
                b->qh[ib] |= (uint16_t)(l << 12);
            }
            continue;
        }
        /* IQ1_M: 3-bit scales, then the super-block scale refitted to them */
        block_iq1_m *b = (block_iq1_m *)blk;
        uint16_t sc[4] = {0, 0, 0, 0};
        float sumqx = 0, sumq2 = 0;
        for (int ib = 0; ib < nsub; ++ib) {
            int l = gguflm_nearest_int(0.5f * (id * scales[ib] - 1));
            l = GGUFLM_MAX(0, GGUFLM_MIN(7, l));
            sc[ib / 4] |= (uint16_t)(l << (3 * (ib % 4)));
            b->qh[ib] |= masks[shifts[ib]];
            const float *xb = xbl + bs * ib;
            if (qw) {
                const float *w = qw + QK_K * ibl + bs * ib;
                for (int i = 0; i < bs; ++i) weight[i] = w[i] * sqrtf(sigma2 + xb[i] * xb[i]);
            } else {
                for (int i = 0; i < bs; ++i) weight[i] = xb[i] * xb[i];
            }
            for (int kg = 0; kg < 2; ++kg) {
                const float *xx = (kg == 0 ? shifts[ib] < 2 : shifts[ib] % 2 == 0) ? x_p : x_m;
                const int8_t *pl = g->level + (qs[2 * ib + kg] + ((b->qh[ib] << (8 - 4 * kg)) & 0x700)) * 8;
                for (int j = 0; j < 8; ++j) {
                    float w = weight[8 * kg + j];
                    float q = xx[pl[j]] * (2 * l + 1);
                    sumqx += w * q * xb[8 * kg + j];
                    sumq2 += w * q * q;
                }
            }
        }
        if (sumq2 > 0) d = sumqx / sumq2;
        const uint16_t s16 = gguflm_fp32_to_fp16(d * 1.1125f);
        sc[0] |= (uint16_t)((s16 & 0x000f) << 12);
        sc[1] |= (uint16_t)((s16 & 0x00f0) << 8);
        sc[2] |= (uint16_t)((s16 & 0x0f00) << 4);
        sc[3] |= (uint16_t)(s16 & 0xf000);
        memcpy(b->scales, sc, 8);
    }
}

static void gguflm_quantize_w_iq1_s(const float *x, void *y, int64_t k, const float *qw) {
    if (gguflm_iq_qgrid_init(GGUFLM_QGRID_IQ1) == 0) gguflm_quantize_iq1_row(GGUFLM_IQ1_S, x, y, k, qw);
}
static void gguflm_quantize_w_iq1_m(const float *x, void *y, int64_t k, const float *qw) {
    if (gguflm_iq_qgrid_init(GGUFLM_QGRID_IQ1) == 0) gguflm_quantize_iq1_row(GGUFLM_IQ1_M, x, y, k, qw);
}
static void gguflm_quantize_row_iq1_m(const float *x, void *y, int64_t k) { gguflm_quantize_w_iq1_m(x, y, k, NULL); }

/* the quantizers of ggml_quantize_chunk: (x, y, k, qw) with qw NULL without importance weights */
typedef void (*gguflm_iq_quantize_fn)(const float *x, void *y, int64_t k, const float *qw);

#define GGUFLM_IQ_QUANTIZERS(tag, TYPE)                                                          \
    static void gguflm_quantize_w_##tag(const float *x, void *y, int64_t k, const float *qw) {   \
        if (gguflm_iq_qgrid_init(gguflm_iq_qgrid_of(TYPE)) == 0) gguflm_quantize_iq_row(TYPE, x, y, k, qw); \
    }                                                                                            \
    static void gguflm_quantize_row_##tag(const float *x, void *y, int64_t k) {                  \
        gguflm_quantize_w_##tag(x, y, k, NULL);                                                  \
    }
/* IQ2_XXS and IQ2_XS: only with importance weights, as in ggml */
static void gguflm_quantize_w_iq2_xxs(const float *x, void *y, int64_t k, const float *qw) {
    if (gguflm_iq_qgrid_init(GGUFLM_QGRID_IQ2_XXS) == 0) gguflm_quantize_iq_row(GGUFLM_IQ2_XXS, x, y, k, qw);
}
static void gguflm_quantize_w_iq2_xs(const float *x, void *y, int64_t k, const float *qw) {
    if (gguflm_iq_qgrid_init(GGUFLM_QGRID_IQ2_XS) == 0) gguflm_quantize_iq_row(GGUFLM_IQ2_XS, x, y, k, qw);
}
GGUFLM_IQ_QUANTIZERS(iq2_s, GGUFLM_IQ2_S)
GGUFLM_IQ_QUANTIZERS(iq3_xxs, GGUFLM_IQ3_XXS)
GGUFLM_IQ_QUANTIZERS(iq3_s, GGUFLM_IQ3_S)
#undef GGUFLM_IQ_QUANTIZERS

/* type's quantizer with importance weights, NULL for the other types */
static inline gguflm_iq_quantize_fn gguflm_iq_quantize_weighted(int type) {
    switch (type) {
    case GGUFLM_IQ1_S: return gguflm_quantize_w_iq1_s;
    case GGUFLM_IQ1_M: return gguflm_quantize_w_iq1_m;
    case GGUFLM_IQ2_XXS: return gguflm_quantize_w_iq2_xxs;
    case GGUFLM_IQ2_XS: return gguflm_quantize_w_iq2_xs;
    case GGUFLM_IQ2_S: return gguflm_quantize_w_iq2_s;
    case GGUFLM_IQ3_XXS: return gguflm_quantize_w_iq3_xxs;
    case GGUFLM_IQ3_S: return gguflm_quantize_w_iq3_s;
    default: return NULL;
    }
}

#endif
