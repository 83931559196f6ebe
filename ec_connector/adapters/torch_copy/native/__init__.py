"""The copier's compiled C helpers: sources, their build, and their ctypes bindings.

- `batchplan.c` (bindings: `batchplan.py`): plans a batch of copies, and queues one that goes wholly
  to the copy engines, in one call from the step thread;
- `launcher.c` (bindings: `launcher.py`): a native thread that queues copy-engine saves;
- `queue.h`: the stream operations both queue with, through the CUDA runtime entry points
  `cudart.py` resolves;
- `build.py`: compiles each source with the system's C compiler on first use and caches the library.

`batchplan.c`'s `io[]` slots are listed in C (its first enum) and in `batchplan.py` (the `IN_*`/
`OUT_*` names, in the same order); tests/adapters/test_batch_plan_slots.py parses both and fails when
they differ, as it does for the workspace sections, the status codes and queue.h's `EC_CALL_*`.
"""
