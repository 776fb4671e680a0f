"""What the test files share (tests/ is on sys.path: ``from helpers.inputs import qkv``).

- ``inputs``: the one factory of random q, k, v (and dout) -- dtype, shape, GQA, layout
  (strided, transposed, packed), device, seed --, ``varlen_qkv`` (packed variable-length batches
  with their cu_seqlens) and ``poison_allocations``, which fills the
  memory an op's outputs will land in with NaN.
- ``grads``: ``reference_grads`` (autograd through a reference, in float32 or in the
  inputs' dtype) and ``assert_grads_close`` / ``check_grads`` (FlashAttention's rule, the
  closeness assertion of every gradient check).
- ``kernels``: what this build compiled (``compiled_config``, ``skip_unless_compiled``), the
  extension skip mark, and which CUDA kernels a call launched.
- ``varlen``: CPU variable-length batches, their per-sequence reference and the checks
  of the varlen CPU test files.
- ``cases``: the awkward sequence-length pairs and the sweep grids (quick subset, or the
  full grid with ``FLASH_ATTN_HOPPER_FULL_TESTS=1``).

The oracles stay where they were: ``reference.py`` (float32 attention, torch SDPA's
semantics, FlashAttention's tolerance rule ``assert_fa_close``) and ``op_emulator.py``
(the ops' contracts emulated on CPU).
"""
