"""One error base for the package; each subclass tells the caller what to do."""

from __future__ import annotations


class ECConnectorError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ECConnectorError, ValueError):
    """A configuration value was rejected: fix the named key and start again."""


class LayoutMismatch(ECConnectorError, ValueError):
    """A payload does not fit the region layout or its extents: nothing was written.

    The caller drops this item from the tier (it is encoded again when needed).
    """


class IllegalTransition(ECConnectorError, RuntimeError):
    """An entry was asked to move to a state its lifecycle forbids: a caller bug."""


class UnknownEntry(ECConnectorError, KeyError):
    """No entry is held under this identifier: treat the item as a miss."""


class AllocatorCorruption(ECConnectorError, RuntimeError):
    """Blocks were freed twice or outside the region: a caller bug; stop using the table."""


class RegionError(ECConnectorError, OSError):
    """The shared region cannot be created, joined or trusted: check the named file."""


class ProtocolError(ECConnectorError, ValueError):
    """A peer sent something outside the protocol: drop the frame and count it."""
