"""Unit tests of the adapters' pure parts: the copy planner and its native build, the CUDA runtime batches,
the save launcher against a fake runtime, the ZMQ codec, the Triton API seam."""
