"""A consumer engine's P2P side (`ConsumerSide`) in its own process, driven over stdin/stdout.

For tests that need the consumer somewhere else than the test process (another network namespace).
Commands (JSON lines; replies start with "@@ "):

    {"op": "fetch", "params": {...}, "items": [[key, rows]], "bound_s": s, "on_ok": "shell cmd" | null}
        step until the request is no longer deferred; when the first OK ack arrives, run `on_ok`
        (e.g. take the link down) before the fetcher sees it. Reply: outcome, seconds, stats.
    {"op": "verify", "key": k, "rows": n}   the local bytes equal the producer's
    {"op": "clean"}                          ConsumerSide.assert_clean()
    {"op": "stop"}

    python tests/fault/peer_consumer.py SHM_DIR EXTRA_JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fault.harness import ConsumerSide  # noqa: E402
from tests.fault.peer_producer import payload, reply, reply_channel_setup  # noqa: E402


class RunOnOk:
    """Wraps the real control client: runs a command when the first OK ack arrives."""

    def __init__(self, side: ConsumerSide, command: str) -> None:
        self._inner, self._command, self.fired = side.control, command, False
        side.fetcher._control = self
        self._side = side

    def send(self, address, message) -> None:
        self._inner.send(address, message)

    def poll(self):
        replies = self._inner.poll()
        if not self.fired and any(r.ack is not None and r.ack.status.value == "OK" for r in replies):
            self.fired = True
            subprocess.run(self._command, shell=True, check=True)
        return replies

    def wait(self, timeout_s: float) -> bool:
        return self._inner.wait(timeout_s)

    def close(self) -> None:
        self._inner.close()

    def restore(self) -> None:
        self._side.fetcher._control = self._inner


def main() -> None:
    reply_channel_setup()
    shm_dir, extra = sys.argv[1], json.loads(sys.argv[2])
    side = ConsumerSide(Path(shm_dir), extra=extra, ucx_error_mode=extra.get("ucx_error_mode", "none"))
    reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "stop":
                side.close()
                reply({"stopped": True})
                return
            if cmd["op"] == "fetch":
                hook = RunOnOk(side, cmd["on_ok"]) if cmd.get("on_ok") else None
                started = time.monotonic()
                try:
                    outcome = side.fetch(
                        cmd["params"], [tuple(i) for i in cmd["items"]], bound_s=cmd["bound_s"]
                    )
                finally:
                    if hook is not None:
                        hook.restore()
                body = {
                    "outcome": outcome,
                    "seconds": time.monotonic() - started,
                    "fired": hook.fired if hook else None,
                    "stats": side.stats.as_dict(),
                }
            elif cmd["op"] == "verify":
                body = {"equal": side.local_bytes(cmd["key"]) == payload(cmd["key"], cmd["rows"])}
            elif cmd["op"] == "clean":
                side.assert_clean()
                body = {}
            else:
                raise ValueError(f"unknown op {cmd['op']!r}")
            reply({"ok": body})
        except Exception as err:  # the test sees the error instead of a hang
            reply({"error": f"{type(err).__name__}: {err}"})


if __name__ == "__main__":
    main()
