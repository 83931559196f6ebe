"""Copier adapter (driven side of the `Copier` port) over torch tensors.

`TorchCopier(region, device="cpu" | "cuda[:N]")` moves `[rows, hidden_dim]` tensors between the
device and the region's blocks. On CPU it copies at once with plain tensor copies; on CUDA it pins
the region for this process (`cudaHostRegister`, mapped), and runs each batch as one Triton kernel
that reads/writes the region through its mapped device pointer, on pooled streams, with end
events polled without blocking. See `docs/benchmarks.md` for the measurements behind that choice.
"""

from ec_connector.adapters.torch_copy.copier import TorchCopier
from ec_connector.adapters.torch_copy.plan import CopyTiming

__all__ = ["CopyTiming", "TorchCopier"]
