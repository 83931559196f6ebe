"""Copier adapter (driven side of the `Copier` port) over torch tensors.

`TorchCopier(region, device="cpu" | "cuda[:N]")` moves `[rows, hidden_dim]` tensors between the
device and the region's blocks. On CPU it copies at once with plain tensor copies. On CUDA it pins
the region for this process (`cudaHostRegister`, mapped) and runs each batch on a pooled stream:
long runs through the copy engines (one `cudaMemcpyBatchAsync`), short runs through one Triton
kernel that reads or writes the region through its mapped device address, side by side; completion
is an end event polled without blocking. docs/benchmarks.md has the measurements behind it.
"""

from ec_connector.adapters.torch_copy.copier import TorchCopier
from ec_connector.adapters.torch_copy.plan import CopyTiming

__all__ = ["CopyTiming", "TorchCopier"]
