"""The GPU's SM clock and board power (NVML through torch.cuda) while a timing runs: the benchmarks
record them beside each provider's time, since a power-capped GPU's clock moves the result."""

from __future__ import annotations

import math
import statistics
import threading

import torch


def median_finite(values) -> float:
    """The median of the values that are not NaN (NaN if none is)."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def gpu_state() -> tuple[float, float]:
    """(SM clock in MHz, board power in W) now, NaN where NVML cannot tell (no pynvml, no GPU)."""
    try:
        return float(torch.cuda.clock_rate()), float(torch.cuda.power_draw()) / 1000.0
    except Exception:  # pynvml missing or the query unsupported: the run goes on without them
        return math.nan, math.nan


class Sampler:
    """Reads gpu_state() every `interval` seconds on a thread while the `with` block runs;
    median() gives the medians of the readings (a reading at exit when the block was shorter than
    one interval; NaN where NVML cannot tell)."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(gpu_state())

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if not self.samples:
            self.samples.append(gpu_state())

    def median(self) -> tuple[float, float]:
        return median_finite([s[0] for s in self.samples]), median_finite([s[1] for s in self.samples])
