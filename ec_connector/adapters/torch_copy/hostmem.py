"""Page-locking the region for the GPU (`cudaHostRegister`, mapped + portable) in this process.

Calls go to the CUDA runtime torch loaded (see cudart.py), so the registration and the device
pointer belong to the same runtime state torch uses.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ec_connector.adapters.torch_copy.cudart import ALREADY_REGISTERED, runtime
from ec_connector.domain.errors import RegionError

_PORTABLE = 0x01
_MAPPED = 0x02


class HostRegistration:
    """This process's registration of `[address, address + nbytes)` as mapped, portable memory.

    If the range is already registered by someone else, it is used as it is and left registered
    at close (`owned` is False). `device_address` is where kernels reach the bytes. Copiers share
    registrations through `acquire`/`release` rather than building these directly.
    """

    def __init__(self, address: int, nbytes: int, device: torch.device, *, name: str) -> None:
        self.address = address
        self.nbytes = nbytes
        self._name = name
        self._owned = False
        self._rt = runtime()
        with torch.cuda.device(device):
            err = self._rt.host_register(address, nbytes, _PORTABLE | _MAPPED)
            if err == ALREADY_REGISTERED:
                self._rt.clear_error()
            elif err:
                self._rt.clear_error()
                raise RegionError(
                    f"cudaHostRegister of region {name!r} ({nbytes} bytes at {address:#x}) failed: "
                    f"{self._rt.describe(err)}; the region must be anonymous or /dev/shm (tmpfs) memory "
                    "within the locked-memory limit (ulimit -l)"
                )
            else:
                self._owned = True
            self.device_address = self._device_pointer(address)
            last = self._device_pointer(address + nbytes - 1)
        if last - self.device_address != nbytes - 1:
            self.close()
            raise RegionError(
                f"region {name!r} is only partly registered with CUDA (another registration overlaps "
                "it); give each region its own page-aligned mapping"
            )

    @property
    def owned(self) -> bool:
        return self._owned

    def close(self) -> None:
        """Unregister if this object registered the range; idempotent."""
        if self._owned:
            self._owned = False
            if self._rt.host_unregister(self.address):
                self._rt.clear_error()

    def _device_pointer(self, host: int) -> int:
        err, pointer = self._rt.host_device_pointer(host)
        if err or not pointer:
            self._rt.clear_error()
            raise RegionError(
                f"cudaHostGetDevicePointer for region {self._name!r} failed: {self._rt.describe(err)}"
            )
        return pointer


_shared: dict[tuple[int, int], list[Any]] = {}  # (address, nbytes) -> [registration, users]
_shared_lock = threading.Lock()


def acquire(address: int, nbytes: int, device: torch.device, *, name: str) -> HostRegistration:
    """The process's registration of the range, made on first use; pair each call with `release`."""
    with _shared_lock:
        entry = _shared.get((address, nbytes))
        if entry is None:
            entry = _shared[(address, nbytes)] = [HostRegistration(address, nbytes, device, name=name), 0]
        entry[1] += 1
        return entry[0]


def release(registration: HostRegistration) -> None:
    """Drop one use; the last user's release unregisters the range."""
    key = (registration.address, registration.nbytes)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None or entry[0] is not registration:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _shared[key]
            registration.close()


class _DeviceArray:
    """Just enough `__cuda_array_interface__` for torch to wrap a device address without copying."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
        }


def device_view(device_address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 CUDA tensor over `nbytes` at `device_address` (mapped host memory: zero-copy)."""
    return torch.as_tensor(_DeviceArray(device_address, nbytes), device=device)
