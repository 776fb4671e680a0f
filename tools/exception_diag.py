"""Which C++ argument errors of the raw ops raise cleanly and which end the process (GPU machine).

Each case runs in its own Python process; prints its exit code and the last lines of its output.
A case that dies is then rerun under gdb (when installed) for the C++ backtrace.
"""
import shutil
import subprocess
import sys

PRE = "import torch, flash_attn_hopper._C\nimport faulthandler; faulthandler.enable()\n"
CASES = {
    "negative_scale": "q = torch.randn(1, 64, 2, 128, device='cuda', dtype=torch.bfloat16)\n"
                      "torch.ops.flash_attn_hopper.fwd(q, q, q, -0.3, False)",
    "zero_scale_plain_python": "q = torch.randn(1, 64, 2, 128, device='cuda', dtype=torch.bfloat16)\n"
                               "torch.ops.flash_attn_hopper.fwd(q, q, q, 0.0, False)",
    "cpu_tensors": "q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)\n"
                   "torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)",
    "uncompiled_head_dim": "q = torch.randn(1, 64, 2, 40, device='cuda', dtype=torch.bfloat16)\n"
                           "torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)",
    "bwd_bad_dout_shape": "q = torch.randn(1, 64, 2, 128, device='cuda', dtype=torch.bfloat16)\n"
                          "o, l = torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)\n"
                          "torch.ops.flash_attn_hopper.bwd(q[:, :32], q, q, q, o, l, 0.1, False)",
}
died = []
for name, body in CASES.items():
    code = PRE + "try:\n" + "".join("    " + line + "\n" for line in body.splitlines()) + \
        "    print('NO ERROR')\nexcept RuntimeError as e:\n    print('RuntimeError:', str(e).splitlines()[0][:160])\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    print(f"{name}: exit {r.returncode}: " + " | ".join(tail), flush=True)
    if r.returncode != 0:
        died.append((name, code))
gdb = shutil.which("gdb")
print("gdb:", gdb, flush=True)
for name, code in died[:1]:
    if gdb:
        r = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 30", "--args", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=200)
        print(f"--- gdb {name}\n" + "\n".join((r.stdout + r.stderr).splitlines()[-45:]), flush=True)
