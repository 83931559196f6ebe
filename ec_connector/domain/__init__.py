"""The pure core: rules about entries, blocks, leases and the wire vocabulary. Stdlib only."""
