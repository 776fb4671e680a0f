"""The package version (the one place it is set: setup.py and the wheel read it from here) and the
torch versions the sources support."""

__version__ = "0.1.0"

#: The oldest torch the sources build against (tested: 2.11 on the H200, 2.14.1 in CI).
TORCH_MIN_VERSION = "2.11"
