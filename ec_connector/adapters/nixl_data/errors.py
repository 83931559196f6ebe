"""Loading NIXL and translating its failures at the port boundary.

NIXL reports failures as `nixl._bindings.nixl*Error` exceptions (and as "ERR" strings from the
Python wrapper's `transfer`/`check_xfer_state`). None of that may cross the PeerTransport port: the
helpers here turn them into ConnectionError / ValueError / RuntimeError subclasses that name the
peer, the operation and what to do.
"""

from __future__ import annotations

import os
from types import ModuleType

from ec_connector.domain.errors import ECConnectorError

NIXL_MISSING = (
    "ec_enable_nixl requires NIXL; install the nixl package or remove ec_enable_nixl from "
    "ec_connector_extra_config."
)


class PeerUnreachable(ECConnectorError, ConnectionError):
    """The peer agent is unknown, gone or cannot be reached: fall back to encoding locally."""


class DataPlaneError(ECConnectorError, RuntimeError):
    """NIXL itself could not be set up or used here: check the backend, UCX_TLS and the region."""


def load_nixl() -> ModuleType:
    """`nixl._api`, imported now (never at module import); RuntimeError with NIXL_MISSING if absent."""
    try:
        from nixl import _api
    except ImportError as e:
        raise RuntimeError(NIXL_MISSING) from e
    return _api


_WORDS = {
    "Backend": "backend error",
    "Cancelled": "cancelled",
    "InvalidParam": "invalid parameter",
    "Mismatch": "mismatch",
    "NotAllowed": "not allowed",
    "NotFound": "not found",
    "NotPosted": "not posted",
    "NotSupported": "not supported",
    "RemoteDisconnect": "remote agent disconnected",
    "RepostActive": "transfer still active",
    "Unknown": "unknown error",
}


def describe(e: BaseException) -> str:
    """A NIXL exception in plain words, without NIXL's status codes (they must not leak out)."""
    kind = type(e).__name__.removeprefix("nixl").removesuffix("Error")
    words = _WORDS.get(kind, type(e).__name__)
    text = str(e).strip()
    return words if not text or text.startswith("NIXL_") else f"{words} ({text})"


def backend_failure(backend: str, mode: str, e: BaseException) -> DataPlaneError:
    hint = ""
    if backend == "UCX":
        tls = os.environ.get("UCX_TLS")
        if tls is None:
            hint = " UCX_TLS is unset (all transports): check that UCX can open a network device here."
        else:
            hint = (
                f" UCX_TLS is {tls!r}: with ucx_error_mode='peer' it must include tcp (or an RDMA "
                "transport), since shared-memory transports cannot report peer failures; add tcp, "
                "unset UCX_TLS, or use ucx_error_mode='none'."
            )
    return DataPlaneError(
        f"cannot create the NIXL {backend} backend (ucx_error_mode={mode!r}): {describe(e)}.{hint}"
    )
