"""The benchmarks a user runs, shipped with the package: `ec-connector bench copy|cache|p2p|serving`.

- `copy_bandwidth`: the copier's save/load GB/s beside a contiguous pinned memcpy (placements in
  `placements`, the aged table in `aging`).
- `compare_cache`: our entry table (default policy and `fifo`) against vLLM's EmbeddingCache on one
  recorded trace (`cache_traces`, `cache_sides`, `vllm_baseline`); vLLM's column only where vLLM is
  installed.
- `p2p`: our ZMQ ack + NIXL READ flow between two processes against a plain copy (`common`,
  `p2p_report`).
- `serving`: real vLLM engines side by side (`serving_engine`, `serving_epd`, `serving_fleet`,
  `serving_hook`, `serving_workload`, `serving_budget`, `serving_expected`, `serving_report`);
  `replay` replays a trace through the entry table (hit ratios of a policy, offline Belady), for the
  serving bench's expected hit ratios and the research eviction bench.

`plots` draws the copy and P2P PNGs; `output` writes every benchmark's JSON, its goal lines and
the headless pyplot the PNGs use. Heavy libraries (vllm, matplotlib, nixl) are imported inside the
functions that need them, so importing a module here needs only the package's own dependencies. The
research benches stay in the source checkout's bench/ folder.
"""
