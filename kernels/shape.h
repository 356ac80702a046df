/* Shapes shared by the CPU kernels, the CUDA kernels and the backend table:
 * the one struct that describes a convolution. Plain data, no code here
 * beyond the declaration of its setter (kernels/cpu/conv.c defines it). */
#ifndef MMP_KERNELS_SHAPE_H
#define MMP_KERNELS_SHAPE_H

typedef struct mmp_conv_shape {
    int N, C, H, W;  /* input (N,C,H,W) */
    int OC, KH, KW;  /* weight (OC,C,KH,KW) */
    int stride, pad; /* same in both spatial dims */
    int OH, OW;      /* output (N,OC,OH,OW), derived */
} mmp_conv_shape;

/* Fills s and derives OH/OW = (H + 2 pad - KH) / stride + 1. */
void mmp_conv_shape_set(mmp_conv_shape *s, int N, int C, int H, int W, int OC, int KH, int KW,
                        int stride, int pad);

#endif
