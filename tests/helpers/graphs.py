"""torch.compile helpers shared by the tests that look at the traced graphs."""
from __future__ import annotations


class GraphRecorder:
    """aot_autograd compilers that keep the forward and backward graphs and run them as they are."""

    def __init__(self):
        self.forward, self.backward = [], []

    def backend(self):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def keep(graphs):
            def compiler(gm, example_inputs):
                graphs.append(gm)
                return make_boxed_func(gm.forward)

            return compiler

        return aot_autograd(fw_compiler=keep(self.forward), bw_compiler=keep(self.backward))
