"""A stand-in accelerator for CPU tests: tensors that say they live on ``meta`` but hold real CPU data.

The engine step's host/device discipline -- one device-to-host transfer per step, no hidden syncs,
no tensor made on the wrong device -- can only be seen on a machine whose device is not the host.
The ``meta`` device gives the "not the host" part (a tensor made without a device is a CPU tensor,
and mixing it with a meta tensor is visible) but computes nothing, so it cannot sample a token.

``FakeDevice`` is a ``TorchDispatchMode`` plus a wrapper subclass, ``DeviceTensor``: every tensor made
for the ``meta`` device (factories with ``device=meta``, ``.to(meta)``, and every result of an op on
a device tensor) becomes a ``DeviceTensor`` that reports ``device == meta`` and carries a real CPU
tensor inside. Ops run on the CPU tensors, so a whole ``ModelRunner`` (built with its device set to
``meta``) samples real tokens, while the mode records what a GPU would have to do:

    d2h     device -> host copies: ``.cpu()`` / ``.to("cpu")``, ``copy_`` into a host tensor, ``.tolist()``
    syncs   the host waiting on a device value: ``.item()``, ``bool(t)``, ``int(t)``, and ops whose output
            shape depends on the values (``nonzero``, boolean-mask indexing, ``masked_select``,
            ``repeat_interleave`` without ``output_size``, ``unique``)
    mixed   an op taking a device tensor and a host tensor of rank >= 1 (a crash on a GPU, or a hidden
            synchronous copy for indices), and ``.numpy()`` of a device tensor (a crash on a GPU)
    h2d     host -> device copies (with their ``non_blocking`` flag)

Each record names the first kvmesh source line on the stack. Two entry points bypass a dispatch mode
and are replaced while it is installed: ``torch.Generator`` makes CPU generators (``meta`` has none; a
CUDA run would draw from CUDA generators: the check is about transfers, not values), and
``torch.tensor(data, device=meta)`` makes a ``DeviceTensor`` and records a blocking upload.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.utils._device
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

FAKE = torch.device("meta")
CPU = torch.device("cpu")
aten = torch.ops.aten

# ops whose output shape depends on tensor values: the host must wait for the device to know it
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten.unique_dim.default,
                  aten._unique2.default, aten.unique_consecutive.default, aten.repeat_interleave.Tensor}
SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default}
TO_OPS = {aten._to_copy.default, aten.to.dtype_layout, aten.to.device, aten.to.dtype, aten.to.other}


def _target_device(func, args, kwargs) -> torch.device | None:
    """The device a factory or ``to`` op puts its result on (None: the inputs')."""
    if "device" in kwargs:
        return kwargs["device"]
    if func is aten.to.device:
        return args[1]
    return None


@dataclass
class StepLog:
    """What one window of work (an engine step) asked of the device."""

    d2h: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    mixed: list[str] = field(default_factory=list)
    h2d: list[str] = field(default_factory=list)


class DeviceTensor(torch.Tensor):
    """A tensor "on the device": reports ``meta``, computes on the CPU tensor ``elem``."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> DeviceTensor:
        with torch.inference_mode(elem.is_inference()):  # a view's wrapper must match its base's kind
            t = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(), dtype=elem.dtype,
                                                    storage_offset=elem.storage_offset(), device=FAKE,
                                                    requires_grad=elem.requires_grad)
        t.elem = elem
        return t

    def __repr__(self) -> str:
        return f"DeviceTensor({self.elem!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist:
            FakeDevice.current.record("d2h", "tolist")
            return args[0].elem.tolist()
        if func is torch.Tensor.numpy:
            FakeDevice.current.record("mixed", ".numpy() of a device tensor")
            return args[0].elem.numpy()
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a DeviceTensor outside FakeDevice")


class HostGenerator(torch.Generator):
    """``torch.Generator(device=...)`` that always makes a CPU generator."""

    def __new__(cls, device=None):
        return torch._C.Generator.__new__(cls, CPU)

    def __init__(self, device=None) -> None:
        pass


def _unwrap(x):
    return x.elem if isinstance(x, DeviceTensor) else x


def _wrap(x):
    return DeviceTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, DeviceTensor) else x


class FakeDevice(TorchDispatchMode):
    """Install with ``with FakeDevice() as dev:``; ``dev.log`` collects from ``dev.window()`` on."""

    current: FakeDevice | None = None

    def __init__(self) -> None:
        super().__init__()
        self.log: StepLog | None = None  # None: nothing is recorded (building the runner)

    def __enter__(self):
        FakeDevice.current = self
        # torch.device(...) contexts cache the factory functions they redirect on first use: fill that cache
        # with the real torch.tensor, not the stand-in installed below (else every later torch.device("meta")
        # context -- transformers builds models in one -- leaves torch.tensor(...) results on the CPU)
        torch.utils._device._device_constructors()
        self._generator, torch.Generator = torch.Generator, HostGenerator  # meta has none (module docstring)
        self._tensor = real_tensor = torch.tensor

        def tensor(data, *, device=None, **kw):  # torch.tensor(..., device=meta) would bypass the mode
            if device is None or torch.device(device) != FAKE:
                return real_tensor(data, device=device, **kw)
            self.record("h2d", "torch.tensor(data, device=device) (non_blocking=False: pageable memory)")
            return DeviceTensor(real_tensor(data, **kw))

        torch.tensor = tensor
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Generator, torch.tensor = self._generator, self._tensor
        FakeDevice.current = None
        return super().__exit__(*exc)

    @contextmanager
    def window(self):
        """Record into a fresh ``StepLog`` (yielded) for the duration of the block."""
        self.log = log = StepLog()
        try:
            yield log
        finally:
            self.log = None

    def record(self, kind: str, what: str) -> None:
        if self.log is not None:
            getattr(self.log, kind).append(f"{what} at {_where()}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        on_device = any(isinstance(t, DeviceTensor) for t in leaves)
        host = [t for t in leaves if type(t) is torch.Tensor and t.dim() > 0]
        target = _target_device(func, args, kwargs)
        to_device = target == FAKE
        if func in TO_OPS and on_device and target == CPU:
            self.record("d2h", "copy to the host")
            return func(*tree_map(_unwrap, args), **kwargs)
        if func in TO_OPS and not on_device and to_device:
            self.record("h2d", f"to(device, non_blocking={kwargs.get('non_blocking', False)})")
            args = tuple(CPU if a == FAKE else a for a in args) if func is aten.to.device else args
        elif func is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, DeviceTensor) and type(src) is torch.Tensor and src.dim() > 0:
                non_blocking = kwargs.get("non_blocking", len(args) > 2 and args[2])
                self.record("h2d", f"copy_(non_blocking={non_blocking})")
            elif type(dst) is torch.Tensor and isinstance(src, DeviceTensor):
                self.record("d2h", "copy_ into a host tensor")
                return dst.copy_(src.elem)
        elif on_device:
            self._check(func, args, kwargs, host)
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, dict(kwargs, device=CPU) if to_device else kwargs))
        if func in SCALAR_READS:
            return out
        return tree_map(_wrap, out) if on_device or to_device else out

    def _check(self, func, args, kwargs, host) -> None:
        name = func.overloadpacket.__name__
        if func in SCALAR_READS:
            self.record("syncs", "a device value read on the host (.item(), bool(), int())")
        elif func in DATA_DEPENDENT and not (func is aten.repeat_interleave.Tensor and kwargs.get("output_size")):
            self.record("syncs", f"{name} (output shape depends on device values)")
        elif func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) and any(
                t is not None and t.dtype == torch.bool for t in args[1]):
            self.record("syncs", f"{name} with a boolean mask (output shape depends on device values)")
        if host:
            self.record("mixed", f"{name} mixes a device tensor with host tensors of shape "
                                 f"{[tuple(t.shape) for t in host]}")


def _where() -> str:
    """The innermost kvmesh source line on the stack (the code that asked for the transfer)."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/replica/" in path and "/tests/" not in path:
            return f"{path.split('/replica/')[-1]}:{frame.lineno} ({frame.name})"
    return "?"
