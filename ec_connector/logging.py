"""structlog configuration: explicit, idempotent, rendered through the standard library.

Nothing is configured on import. `configure_logging()` makes each event one line (logfmt, or JSON
on request), rendered when a handler writes it, and hands it to a stdlib logger, so the host
process (vLLM) owns the handlers.
Loggers are not cached on first use, so they survive pickling and new processes.

Lines are written off the caller's thread (`write_lines_off_thread`): our logger keeps one
`QueueHandler`, and one daemon thread hands the queued records to the real handlers (vLLM's, or
stderr for our CLI) within 20 ms of the first, sleeping while none come. A write to a pipe whose
reader lags (a container's log collector, a busy terminal) then never holds the engine's step
thread, which logs one line per peer transfer; enqueueing takes microseconds. Pending lines are
written at exit; a forked child gets its own writer thread.

Inside vLLM the connector reads its options from the environment (`options_from_env`):
`VLLM_EC_LOG_JSON` ("true", "1", "yes" in any case render JSON; anything else logfmt) and
`VLLM_EC_LOG_LEVEL` (a logging level name, default INFO). Both are inherited by every process
vLLM starts, so one setting covers the API server, EngineCore and the workers.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import logging
import logging.handlers
import multiprocessing.util
import os
import queue
import re
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

import structlog

_configured: tuple[bool, int] | None = None

JSON_ENV = "VLLM_EC_LOG_JSON"
LEVEL_ENV = "VLLM_EC_LOG_LEVEL"
_TRUE = frozenset({"true", "1", "yes"})
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def options_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """`configure_logging` keyword arguments from VLLM_EC_LOG_JSON and VLLM_EC_LOG_LEVEL."""
    json = environ.get(JSON_ENV, "").strip().lower() in _TRUE
    level = environ.get(LEVEL_ENV, "INFO").strip().upper()
    if level not in _LEVELS:
        raise ValueError(
            f"{LEVEL_ENV} = {environ[LEVEL_ENV]!r} is invalid: expected one of {', '.join(_LEVELS)}"
        )
    return {"json": json, "level": level}


def debug_enabled(module: str) -> Callable[[], bool]:
    """A check to put before a debug line on a hot path (the step thread, the ack path).

    structlog builds and runs its processors for a debug line before dropping it (~14 µs on the CPU
    VM); this reads the stdlib logger's cached level (~0.2 µs) and follows later level changes.
    """
    return functools.partial(logging.getLogger(module).isEnabledFor, logging.DEBUG)


_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "ec_log_context", default=_NO_FIELDS
)


class log_context:  # noqa: N801 - used as a `with` statement, like contextlib's helpers
    """Fields every line logged inside the `with` carries (nested contexts add to the outer one).

    What structlog's `bound_contextvars` does, in one context variable: entering and leaving cost
    ~3 µs instead of ~16 µs for five fields (CPU VM), and merging them into a line does not scan
    every variable of the context (`configure_logging` merges only these; structlog's own
    contextvars are not used in this package). The consumer binds one per fetch step, the producer one per
    request it answers, so it runs on the step thread and on the ack path.
    """

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: object) -> None:
        self._fields = fields
        self._token: contextvars.Token[Mapping[str, Any]] | None = None

    def __enter__(self) -> None:
        outer = _context.get()
        self._token = _context.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _context.reset(self._token)


def _merge_log_context(_: object, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the fields of the enclosing `log_context`, under the line's own."""
    bound = _context.get()
    if not bound:
        return event_dict
    merged = dict(bound)
    merged.update(event_dict)
    return merged


_KEY_BREAK = re.compile(r"[\x00- ]")  # what logfmt cannot carry in a key (control chars, space)


class LogfmtLine:
    """One logfmt line per event, `event` first: the output of structlog's
    `LogfmtRenderer(key_order=["event"], drop_missing=True)`, for about half its cost.

    structlog checks every key character by character in Python; here a compiled pattern does. It
    runs on the engine's step thread for every INFO line (one per peer transfer, for instance).
    """

    def __call__(self, _: object, __: str, event_dict: MutableMapping[str, Any]) -> str:
        event = event_dict.pop("event", None)
        elements = [] if event is None else [_pair("event", event)]
        elements += [_pair(key, value) for key, value in event_dict.items()]
        return " ".join(elements)


def _pair(key: str, value: object) -> str:
    if _KEY_BREAK.search(key):
        raise ValueError(f'Invalid key: "{key}"')
    if value is None:
        return key + "="
    if value is True:
        return key  # a flag
    text = "false" if value is False else str(value)
    quoted = " " in text or "=" in text or '"' in text
    if quoted and "\\" in text:
        text = text.replace("\\", "\\\\")
    if '"' in text:
        text = text.replace('"', '\\"')
    if "\n" in text:
        text = text.replace("\n", "\\n")
    return f'{key}="{text}"' if quoted else f"{key}={text}"


class _Line:
    """A log line rendered the first time it is read (`str`): by the handler that writes it, which
    is the writer thread once `write_lines_off_thread` ran. The event's fields are fixed when it is
    logged (context merged, timestamp taken, exception formatted); only the text is made later."""

    __slots__ = ("_event", "_render", "_text")
    _text: str | None

    def __init__(self, render: Callable[..., str], event: MutableMapping[str, Any]) -> None:
        self._render, self._event, self._text = render, event, None

    def __str__(self) -> str:
        text = self._text
        if text is None:
            text = self._text = self._render(None, "", self._event)
        return text


class _RenderWhenWritten:
    """structlog's last processor: hands stdlib a `_Line` instead of the rendered text."""

    def __init__(self, render: Callable[..., str]) -> None:
        self._render = render

    def __call__(self, _: object, __: str, event_dict: MutableMapping[str, Any]) -> tuple[tuple, dict]:
        return (_Line(self._render, event_dict),), {}


def configure_logging(*, json: bool = False, level: int | str = logging.INFO) -> None:
    """Configure structlog for this process; calling again with the same arguments does nothing."""
    global _configured
    numeric = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r} is not a logging level name")
    if _configured == (json, numeric):
        return
    renderer: Callable[..., str] = (
        structlog.processors.JSONRenderer(sort_keys=True) if json else LogfmtLine()  # type: ignore[assignment]
    )
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,  # first: a dropped line costs nothing more
            _merge_log_context,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _RenderWhenWritten(renderer),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    logging.getLogger("ec_connector").setLevel(numeric)
    _configured = (json, numeric)


def attach_stderr_handler() -> None:
    """For our own entry points (the CLI): print ec_connector's lines to stderr, once."""
    ours = logging.getLogger("ec_connector")
    handlers = list(ours.handlers) + list(_writer.handlers if _writer is not None else ())
    if not any(getattr(h, "_ec_connector", False) for h in handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ec_connector = True  # type: ignore[attr-defined]
        ours.addHandler(handler)
    write_lines_off_thread()


class _Handoff(logging.handlers.QueueHandler):
    """Enqueues a record as it is: our lines arrive rendered (no args, exceptions in the text)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record if not record.args and not record.exc_info else super().prepare(record)


class _LineWriter:
    """One daemon thread that hands queued records to `handlers`, a burst at a time.

    While nothing is queued it sleeps in the queue without waking: a thread woken on a timer would
    take the GIL from the engine's step thread 50 times a second for nothing, and keep an idle
    engine's process waking. A record wakes it; it then waits WRITE_INTERVAL_S before writing, so
    the lines logged meanwhile go out together and the woken writer gives the caller's core
    straight back (on a 2-core host it would often run before the caller).
    """

    def __init__(self, handlers: tuple[logging.Handler, ...]) -> None:
        self.handlers = handlers
        self.queue: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="ec-log-writer", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            first = self.queue.get()  # None: `stop` woke it
            self._stop.wait(WRITE_INTERVAL_S)
            if first is not None:
                self._write(first)
            if not self._drain() or first is None or self._stop.is_set():
                return

    def _drain(self) -> bool:
        """Write every queued record; False once the stop mark was among them."""
        running = True
        while True:
            try:
                record = self.queue.get_nowait()
            except queue.Empty:
                return running
            if record is None:
                running = False
            else:
                self._write(record)

    def _write(self, record: logging.LogRecord) -> None:
        for handler in self.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)

    def stop(self) -> None:
        """Write what is queued and end the thread; idempotent."""
        if self._thread is not None:
            self._stop.set()
            self.queue.put(None)
            self._thread.join()
            self._thread = None


WRITE_INTERVAL_S = 0.02  # the longest a line waits in the queue
_writer: _LineWriter | None = None


def write_lines_off_thread() -> None:
    """Put ec_connector's handlers behind one queue and one writer thread; idempotent.

    Handlers added to our logger since the last call join the writer's (none are lost or doubled).
    """
    global _writer
    ours = logging.getLogger("ec_connector")
    direct = [h for h in ours.handlers if not isinstance(h, _Handoff)]
    if not direct:
        return
    for handler in direct:
        ours.removeHandler(handler)
    if _writer is not None:
        _writer.handlers = (*_writer.handlers, *direct)
        return
    _writer = _LineWriter(tuple(direct))
    ours.addHandler(_Handoff(_writer.queue))
    atexit.register(_stop_writer)
    _stop_at_multiprocessing_exit(None)


def _stop_at_multiprocessing_exit(_: object) -> None:
    """multiprocessing's children end with os._exit (no atexit) but run its finalizers first."""
    multiprocessing.util.Finalize(None, _stop_writer, exitpriority=0)


def _stop_writer() -> None:
    """Write what is still queued and end the thread (at exit)."""
    if _writer is not None:
        _writer.stop()


def _writer_after_fork() -> None:
    """A forked child inherits the queue but not the thread: give it a writer (and queue) of its
    own; lines the parent had queued stay the parent's to write."""
    global _writer
    if _writer is None:
        return
    _writer = _LineWriter(_writer.handlers)
    for handler in logging.getLogger("ec_connector").handlers:
        if isinstance(handler, _Handoff):
            handler.queue = _writer.queue


class _Anchor:  # multiprocessing keeps after-fork callbacks only while their object lives
    pass


_anchor = _Anchor()
os.register_at_fork(after_in_child=_writer_after_fork)
# A multiprocessing child clears the finalizers it inherited after the fork: register again there.
multiprocessing.util.register_after_fork(_anchor, _stop_at_multiprocessing_exit)
