"""structlog configuration: explicit, idempotent, rendered through the standard library.

Nothing is configured on import. `configure_logging()` renders each event to one line (logfmt, or
JSON on request) and hands it to a stdlib logger, so the host process (vLLM) owns the handlers.
Loggers are not cached on first use, so they survive pickling and new processes.

Inside vLLM the connector reads its options from the environment (`options_from_env`):
`VLLM_EC_LOG_JSON` ("true", "1", "yes" in any case render JSON; anything else logfmt) and
`VLLM_EC_LOG_LEVEL` (a logging level name, default INFO). Both are inherited by every process
vLLM starts, so one setting covers the API server, EngineCore and the workers.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
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


def configure_logging(*, json: bool = False, level: int | str = logging.INFO) -> None:
    """Configure structlog for this process; calling again with the same arguments does nothing."""
    global _configured
    numeric = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r} is not a logging level name")
    if _configured == (json, numeric):
        return
    renderer = structlog.processors.JSONRenderer(sort_keys=True) if json else LogfmtLine()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    logging.getLogger("ec_connector").setLevel(numeric)
    _configured = (json, numeric)


def attach_stderr_handler() -> None:
    """For our own entry points (the CLI): print ec_connector's lines to stderr, once."""
    root = logging.getLogger("ec_connector")
    if not any(getattr(h, "_ec_connector", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ec_connector = True  # type: ignore[attr-defined]
        root.addHandler(handler)
