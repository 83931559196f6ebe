"""Our lines are written by a writer thread, not by the caller (the engine's step thread).

Each case runs in a fresh interpreter: the writer is process-wide logging state.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_a_handler_that_cannot_write_does_not_hold_the_caller(tmp_path):
    res = _run(
        """
        import logging, threading, structlog
        from ec_connector import logging as ec_logging

        release, written = threading.Event(), []

        class Stuck(logging.Handler):  # a pipe whose reader stopped reading
            def emit(self, record):
                release.wait(60)
                written.append(record.getMessage())

        ec_logging.configure_logging()
        logging.getLogger("ec_connector").addHandler(Stuck())
        ec_logging.write_lines_off_thread()
        log = structlog.get_logger("ec_connector.test")
        for i in range(3):
            log.info("line", n=i)  # would wait 60 s on the first if written here
        assert not release.is_set() and written == [], written
        release.set()
        ec_logging._stop_writer()  # what exit does: write what is queued
        print("|".join(w.split(" ")[1] for w in written))
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "n=0|n=1|n=2"


def test_every_line_is_written_in_order_by_the_time_the_process_exits(tmp_path):
    res = _run(
        """
        import structlog
        from ec_connector import logging as ec_logging

        ec_logging.configure_logging()
        ec_logging.attach_stderr_handler()
        ec_logging.attach_stderr_handler()  # twice: still one handler, one writer
        log = structlog.get_logger("ec_connector.test")
        for i in range(500):
            log.info("line", n=i)
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    numbers = [line.split("n=")[1].split()[0] for line in res.stderr.splitlines() if "event=line" in line]
    assert numbers == [str(i) for i in range(500)]


def test_a_forked_child_writes_its_lines_through_a_writer_of_its_own(tmp_path):
    res = _run(
        """
        import logging, multiprocessing as mp, structlog
        from ec_connector import logging as ec_logging

        def child():
            log = structlog.get_logger("ec_connector.test")
            for i in range(50):
                log.info("child", n=i)

        if __name__ == "__main__":
            ec_logging.configure_logging()
            handler = logging.FileHandler("lines.log")
            logging.getLogger("ec_connector").addHandler(handler)
            ec_logging.write_lines_off_thread()
            structlog.get_logger("ec_connector.test").info("parent")
            proc = mp.get_context("fork").Process(target=child)
            proc.start()
            proc.join(60)
            assert proc.exitcode == 0
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    lines = (tmp_path / "lines.log").read_text().splitlines()
    child = [line.split("n=")[1].split()[0] for line in lines if "event=child" in line]
    assert child == [str(i) for i in range(50)]
    assert sum("event=parent" in line for line in lines) == 1


def test_an_idle_writer_sleeps_without_waking_and_a_line_still_goes_out_at_once(tmp_path):
    # A writer woken on a timer would take the GIL from a busy step thread every interval; idle,
    # it must not run at all (its thread's voluntary context switches stay put), and a line logged
    # then still goes out within about one interval.
    res = _run(
        """
        import logging, time, structlog
        from pathlib import Path
        from ec_connector import logging as ec_logging

        ec_logging.configure_logging()
        handler = logging.FileHandler("lines.log")
        logging.getLogger("ec_connector").addHandler(handler)
        ec_logging.write_lines_off_thread()
        log = structlog.get_logger("ec_connector.test")
        log.info("first")
        time.sleep(0.2)
        tid = ec_logging._writer._thread.native_id

        def switches():
            for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])

        before = switches()
        time.sleep(0.5)  # 25 intervals
        idle = switches() - before
        log.info("second")
        t0 = time.monotonic()
        while "event=second" not in Path("lines.log").read_text():
            assert time.monotonic() - t0 < 5, "the line never went out"
            time.sleep(0.002)
        print(idle, round(time.monotonic() - t0, 3))
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    idle, waited = res.stdout.split()
    assert int(idle) == 0
    assert float(waited) < 1.0
