"""Page-locking the region for the GPU (`cudaHostRegister`, mapped + portable) in this process.

The CUDA runtime is the one torch loaded, reached through ctypes (found in /proc/self/maps), so the
registration and the device pointer come from the same runtime torch uses. Where that library
cannot be found, torch's own `cudart()` binding registers and the host address is used as the device
address (true wherever the device reports `canUseHostPointerForRegisteredMem`, e.g. x86-64 Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import torch

from ec_connector.domain.errors import RegionError

_PORTABLE = 0x01
_MAPPED = 0x02
_ALREADY_REGISTERED = 712


def _runtime_library() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        paths = set()
    found = ctypes.util.find_library("cudart")
    for path in sorted(paths) + ([found] if found else []):
        try:
            lib = ctypes.CDLL(path)
            lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
            lib.cudaHostGetDevicePointer.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_void_p,
                ctypes.c_uint,
            ]
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            lib.cudaGetErrorString.argtypes = [ctypes.c_int]
            lib.cudaGetLastError.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None


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
        with torch.cuda.device(device):
            torch.cuda.init()
            self._lib = _runtime_library()
            err = self._register()
            if err == _ALREADY_REGISTERED:
                self._clear_error()
            elif err:
                raise RegionError(
                    f"cudaHostRegister of region {name!r} ({nbytes} bytes at {address:#x}) failed: "
                    f"{self._describe(err)}; check the locked-memory limit (ulimit -l) and the GPU"
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
        if not self._owned:
            return
        self._owned = False
        if self._lib is not None:
            self._lib.cudaHostUnregister(ctypes.c_void_p(self.address))
        else:
            torch.cuda.cudart().cudaHostUnregister(self.address)

    def _register(self) -> int:
        flags = _PORTABLE | _MAPPED
        if self._lib is not None:
            return int(self._lib.cudaHostRegister(ctypes.c_void_p(self.address), self.nbytes, flags))
        return _code(torch.cuda.cudart().cudaHostRegister(self.address, self.nbytes, flags))

    def _clear_error(self) -> None:
        if self._lib is not None:
            self._lib.cudaGetLastError()

    def _device_pointer(self, host: int) -> int:
        if self._lib is None:
            return host
        out = ctypes.c_void_p()
        err = int(self._lib.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(host), 0))
        if err or out.value is None:
            raise RegionError(
                f"cudaHostGetDevicePointer for region {self._name!r} failed: {self._describe(err)}"
            )
        return int(out.value)

    def _describe(self, err: int) -> str:
        if self._lib is not None:
            text = self._lib.cudaGetErrorString(err)
            return f"error {err} ({text.decode() if text else '?'})"
        return f"error {err}"


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


def _code(result: Any) -> int:
    value = getattr(result, "value", result)
    return int(value)


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
