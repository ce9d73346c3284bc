/* Quantization with importance weights (ggml's quant_weights: one float per column of the row),
 * byte-identical with ggml_quantize_chunk given the same weights. A type whose ggml quantizer
 * ignores the weights has none here (NULL): its reference quantizer is the answer.
 */
#ifndef GGUFLM_QUANTS_IMATRIX_H
#define GGUFLM_QUANTS_IMATRIX_H

#include "quants_lut_ref.h"

/* x [k] -> y (row_bytes(type, k)) with the importance weights qw [k] of the row's columns */
typedef void (*gguflm_quantize_w_fn)(const float *x, void *y, int64_t k, const float *qw);

static inline gguflm_quantize_w_fn gguflm_quantize_weighted(int type) {
    switch (type) {
    case GGUFLM_IQ4_NL: return gguflm_quantize_w_iq4_nl;
    case GGUFLM_IQ4_XS: return gguflm_quantize_w_iq4_xs;
    default: return NULL;
    }
}

#endif
