"""Developer diagnostic on the GPU: which of our aten overrides handles an SDPA call with the FLASH
backend after activation, with what argument strides, and what strides the result has.

    python3 tools/registry_diag.py
"""
import torch
import torch.nn.functional as F
from torch.nn import attention
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_hopper  # noqa: F401  (registers the implementation)
from flash_attn_hopper import torch_registry as reg


def main():
    calls = []
    for name, (refusal, impl) in list(reg._OVERRIDES.items()):
        def traced(*args, _impl=impl, _name=name, **kwargs):
            calls.append((_name, [tuple(a.stride()) for a in args if isinstance(a, torch.Tensor)][:4]))
            return _impl(*args, **kwargs)
        reg._OVERRIDES[name] = (refusal, traced)
    attention.activate_flash_attention_impl(reg.IMPL_NAME)
    try:
        for layout in ("bhsd_contiguous", "bshd_memory"):
            for causal in (False, True):
                for gqa in (1, 4):
                    shape_q, shape_k = (2, 8, 777, 128), (2, 8 // gqa, 777, 128)
                    make = (lambda s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)) if layout == "bhsd_contiguous" \
                        else (lambda s: torch.randn(s[0], s[2], s[1], s[3], device="cuda", dtype=torch.bfloat16).transpose(1, 2))
                    q, k, v = make(shape_q), make(shape_k), make(shape_k)
                    calls.clear()
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa > 1)
                    ok = out.stride() == torch.empty_like(q).stride()
                    print(f"{layout:16s} causal={int(causal)} gqa={gqa}: out {tuple(out.stride())} "
                          f"{'==' if ok else '!='} empty_like(q) {tuple(torch.empty_like(q).stride())}; calls {calls}",
                          flush=True)
    finally:
        attention.restore_flash_attention_impl()


if __name__ == "__main__":
    main()
