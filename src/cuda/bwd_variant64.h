// bwd_variant64.h -- the variant number of the head-dim-64 backward kernel, version 2
// (bwd_wgmma64_sm90.cuh), for bl_bwd_set_variant. It exists only in builds with -DBL_BWD_D64_V2;
// there it is also the library's default for D = 64 (the other variants: bwd_common.cuh).
#pragma once
#define BL_BWD_VARIANT_WGMMA64 2
