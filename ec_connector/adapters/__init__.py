"""Adapters: translators between the ports and the world (torch, /dev/shm, ZMQ, NIXL, vLLM)."""
