"""The Triton specialization key of every kernel launch: what the JIT compiles a new kernel for.

A compiled Triton kernel is cached per key: its constexprs and launch options, and per argument its type
(a tensor's dtype) and, unless the kernel lists it in ``do_not_specialize``, whether an int is 1 or a
multiple of 16 and a pointer 16-byte aligned. ``LaunchKeys`` wraps the kernel class's ``run`` (the launch
path, compiled or interpreted) and computes that key with Triton's own ``native_specialize_impl``, so
the same count works on CPU through the interpreter (which compiles nothing) and on a GPU.
"""

from __future__ import annotations

from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend


def not_specialized(kernel) -> set:
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:  # the interpreter keeps the decorator's arguments
        names = getattr(kernel, "kwargs", {}).get("do_not_specialize")
    return set(names or ())


def launch_key(kernel, args: tuple, kwargs: dict) -> tuple:
    skip = not_specialized(kernel)
    specialized = tuple(native_specialize_impl(BaseBackend, arg, False, name not in skip and i not in skip, True)
                        for i, (name, arg) in enumerate(zip(kernel.arg_names, args, strict=False)))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in ("grid", "warmup")))
    return kernel.fn.__name__, specialized, options


class LaunchKeys:
    """``with LaunchKeys() as keys:`` -- ``keys.seen`` the set of keys launched inside, ``keys.launches`` how many."""

    def __init__(self) -> None:
        self.seen: set[tuple] = set()
        self.launches = 0

    def __enter__(self) -> LaunchKeys:
        from kvmesh.replica.attention import triton_paged_attention as tpa

        self.kernel_class = type(tpa._unified_attention_kernel)  # JITFunction, or InterpretedFunction on CPU
        self.run = run = self.kernel_class.run

        def keyed(kernel, *args, **kwargs):
            self.seen.add(launch_key(kernel, args, kwargs))
            self.launches += 1
            return run(kernel, *args, **kwargs)

        self.kernel_class.run = keyed
        return self

    def __exit__(self, *exc) -> None:
        self.kernel_class.run = self.run

