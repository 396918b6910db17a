// bwd_variant64.h -- the variant numbers of the head-dim-64 backward kernels, version 2
// (bwd_wgmma64_sm90.cuh), for bl_bwd_set_variant. They exist only in builds with
// -DBL_BWD_D64_V2; there WGMMA64 is also the library's default for D = 64 (the other variants:
// bwd_common.cuh).
#pragma once
#define BL_BWD_VARIANT_WGMMA64 2        // dq reductions right after each tile's dQ^T
#define BL_BWD_VARIANT_WGMMA64_DEFER 3  // dq reductions deferred behind the next tile's products
#define BL_BWD_VARIANT_WGMMA64_PAIR 4   // version 3: two list entries per iteration (bwd_wgmma64p_sm90.cuh)
