"""flash_attn_hopper: exact attention for NVIDIA Hopper (sm_90a) with FlashAttention-3's API.

    from flash_attn_hopper import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)      # (batch, seqlen, nheads, headdim)

``import flash_attn_hopper`` works on any machine; :func:`is_available` says
whether the kernels can run here and :func:`unavailable_reason` why not.
``python -m flash_attn_hopper`` prints the build and checks it.

``flash_attn_hopper.scaled_dot_product_attention`` is a drop-in for torch's
(``patch_sdpa()`` routes ``F.scaled_dot_product_attention`` to it); importing
the package also registers ``"flash_attn_hopper"`` with torch's
flash-attention registry (see :mod:`flash_attn_hopper.torch_registry`).
"""

from ._version import __version__
from . import manifest, support
from ._build_info import build_info
from .interface import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from .combine import flash_attn_combine
from .kvcache import flash_attn_with_kvcache, get_scheduler_metadata
from .ops import is_available, unavailable_reason
from .sdpa import patch_sdpa, scaled_dot_product_attention, sdpa_fallback_reason
from . import torch_registry  # registers (never activates) with torch.nn.attention's registry

__all__ = [
    "__version__",
    "build_info",
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
    "is_available",
    "manifest",
    "patch_sdpa",
    "scaled_dot_product_attention",
    "sdpa_fallback_reason",
    "support",
    "torch_registry",
    "unavailable_reason",
]
