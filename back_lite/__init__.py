"""BackLite: attention with an exact forward and a block-sparse backward.

    from back_lite import BackLite
    attn = BackLite(negl_prob=0.05)
    out = attn(q, k, v, causal=True)      # q: (B, Sq, Hq, D), k, v: (B, Sk, Hk, D)

Importing this package loads the C library (see back_lite/_lib.py for where it is looked for).
"""
from . import _lib
from . import ops  # registers the torch.library ops (namespace back_lite)
from . import functional
from .functional import (attention, backend_available, backend_supports, backward,
                         backward_sparsity, computable_tiles, forward, num_tiles, select,
                         tile_shape)
from .module import BackLite
from .workspace_pool import release as empty_workspace_pool
from .calibrate import CalibrationResult, calibrate  # also loads back_lite.diagnostics
from . import distributed  # context parallelism: ring / Ulysses attention on torch.distributed
from . import integrations  # SDPA drop-in; .transformers / .diffusers load their framework on use

__version__ = "0.1.0"
version = __version__
# Version of the loaded C library (they are built together; both should read the same).
library_version = _lib.version_string()
library_path = _lib.path

__all__ = ["BackLite", "attention", "forward", "backward", "select", "tile_shape", "num_tiles",
           "backend_available", "backend_supports", "computable_tiles", "backward_sparsity",
           "empty_workspace_pool", "functional", "ops",
           "version", "library_version", "library_path"]
