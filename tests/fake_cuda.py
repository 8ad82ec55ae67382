"""A pretend CUDA device for CPU-only machines: tensors "on cuda:0" live in host memory, and mixing them with host
tensors fails as it fails on a real GPU.

Why: every GRPO run on a GPU once failed at its first sampled token (the sampler returned its tokens on the host and
``log_softmax(logits).gather(1, tokens)`` mixed them with the logits on ``cuda:0``) while every test passed, because
no test could see a device other than the host. Under ``FakeCuda`` the same code runs with ``device="cuda"`` on a CPU
build of torch, and the mix raises the error CUDA raises ("Expected all tensors to be on the same device").

How (a ``TorchFunctionMode``: every torch call made from Python, inside transformers' models too, passes through it):

* Which tensors are "on the device" is a weak set of tensor objects. A tensor joins it when made with
  ``device="cuda"`` (factories, ``.to``, ``.cuda``, a module's ``.to``) or when made by an op from a device tensor;
  ``.cpu()`` / ``.to("cpu")`` / ``.numpy()`` give a host tensor (a copy, as on a GPU). ``Tensor.device`` answers
  ``cuda:0`` for device tensors, so code that follows ``x.device`` behaves as on a GPU.
* The rule CUDA applies (``check_device_mix``): an op's tensor arguments are all on one device, except host tensors
  of zero dimensions (CUDA accepts those as scalars), host index tensors of indexing (``x[idx]``, ``x[idx] = v``),
  and the source of ``copy_`` (a transfer). A CPU ``torch.Generator`` given to an op on device tensors fails too.
* Host syncs are counted (``syncs``): ``.item()``, ``.tolist()``, ``bool()``, ``int()``, ``float()`` and ``.cpu()``
  of a device tensor each wait for the device on a GPU. A decode loop's syncs per token are a figure the tests can
  bound without a GPU.
* Threads started inside the block (the rollout's thread pool) run under the mode too.
* ``torch.cuda``'s runtime calls that the trainer makes (current device, RNG state, peak memory, synchronize, ...)
  answer as one idle device would; the RNG that device tensors draw from is the host's (the same numbers as on the
  CPU, so a run under ``FakeCuda`` must give exactly the CPU run's tokens).

What it cannot show: speed, memory, kernels, CUDA graphs, ``torch.compile`` for CUDA, a ``torch.Generator`` on the
device (its constructor needs a CUDA build), and whether a bf16 autocast changes results (autocast for "cuda" is
off on a CPU build). ``make test-gpu`` runs the real device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = torch.device("cuda", 0)
HOST = torch.device("cpu")

# functions whose tensor index arguments may stay on the host (CUDA copies them over)
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put,
             torch.index_put}
# calls that look at tensors' metadata only (never their values): no device rule applies
_METADATA = {torch._has_compatible_shallow_copy_type, torch.is_same_size}
# calls that move a tensor's values to the host: one device sync each
_SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__}
_FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.tensor, torch.as_tensor,
              torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye, torch.zeros_like,
              torch.ones_like, torch.full_like, torch.empty_like, torch.rand_like, torch.randn_like,
              torch.randint_like, torch.tril_indices, torch.triu_indices, torch.empty_strided, torch.range,
              torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_full, torch.Tensor.new_empty,
              torch.Tensor.new_tensor}


class DeviceGenerator(torch.Generator):
    """``torch.Generator(device="cuda")`` under ``fake_cuda``: a host generator that says it is on the device (a CPU
    build cannot make a CUDA generator); ops on device tensors accept it, as CUDA accepts a CUDA generator."""

    def __new__(cls, device: Any = "cpu"):
        return super().__new__(cls, "cpu")

    def __init__(self, device: Any = "cpu") -> None:
        self._on_device = torch.device(device).type == "cuda"

    @property
    def device(self) -> torch.device:
        return DEVICE if self._on_device else HOST


class DeviceMixError(RuntimeError):
    """What CUDA raises when an op mixes tensors of two devices."""


def _is_device(value: Any) -> bool:
    return isinstance(value, (torch.device, str)) and torch.device(value).type == "cuda"


def _device_arg(value: Any) -> torch.device | None:
    """The device a ``device=``-like argument names, or None when it names none."""
    if isinstance(value, torch.device):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError:  # a dtype string or the like
            return None
    return None


class FakeCuda(TorchFunctionMode):
    """Enter with ``with FakeCuda() as fake:`` (or the ``fake_cuda`` context manager, which also answers
    ``torch.cuda``'s runtime calls). ``fake.syncs`` counts host syncs of device tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.on_device: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.syncs = 0
        self.active = True

    # -- marks ----------------------------------------------------------------------------------------------------
    def mark(self, tensor: torch.Tensor, on_device: bool) -> torch.Tensor:
        if on_device:
            self.on_device[tensor] = True
        else:
            self.on_device.pop(tensor, None)
        return tensor

    def is_on_device(self, tensor: torch.Tensor) -> bool:
        return tensor in self.on_device

    def _mark_outputs(self, out: Any, on_device: bool) -> Any:
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.mark(leaf, on_device)
        return out

    # -- the mode -------------------------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        owner = getattr(func, "__self__", None)  # a property's getter/setter: the descriptor it belongs to
        if owner is torch.Tensor.device:
            return DEVICE if self.is_on_device(args[0]) else func(*args, **kwargs)
        if owner is torch.Tensor.is_cuda:
            return self.is_on_device(args[0])
        if owner is torch.Tensor.data and getattr(func, "__name__", "") == "__set__":
            func(*args, **kwargs)
            self.mark(args[0], self.is_on_device(args[1]))
            return None
        if func is torch.Tensor.get_device:
            return 0 if self.is_on_device(args[0]) else func(*args, **kwargs)
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return self._transfer(func, args, kwargs)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and self.is_on_device(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func is torch.Tensor.pin_memory:
            return self.mark(args[0].clone(), False)
        if func is torch.Tensor.is_pinned:
            return False
        if func in _FACTORIES and "device" in kwargs:
            target = _device_arg(kwargs["device"])
            if target is not None and target.type in ("cuda", "cpu"):  # others (meta) keep their own meaning
                kwargs = {**kwargs, "device": HOST}
                self.check_device_mix(func, args, kwargs)
                return self._mark_outputs(func(*args, **kwargs), target.type == "cuda")
        tensors = self.check_device_mix(func, args, kwargs)
        if func in _SYNCS and any(self.is_on_device(t) for t in tensors):
            self.syncs += 1
        out = func(*args, **kwargs)
        if any(self.is_on_device(t) for t in tensors):
            if func is torch.Tensor.copy_:  # the destination keeps its device
                return out
            self._mark_outputs(out, True)
        return out

    def _transfer(self, func, args, kwargs) -> torch.Tensor:
        """``.to`` / ``.cuda`` / ``.cpu``: run on the host, then mark the result as the target device's."""
        source = args[0]
        if func is torch.Tensor.cpu:
            target = HOST
        elif func is torch.Tensor.cuda:
            target = DEVICE
        else:
            target = None
            for value in list(args[1:]) + [kwargs.get("device")]:
                if isinstance(value, torch.Tensor):  # .to(other): other's device and dtype
                    target = DEVICE if self.is_on_device(value) else HOST
                elif _device_arg(value) is not None:
                    target = _device_arg(value)
        if target is None:  # a dtype change only: stays where it is
            return self._mark_outputs(func(*args, **kwargs), self.is_on_device(source))
        if target.type not in ("cuda", "cpu"):  # e.g. meta: as torch does it, off the pretend device
            return self._mark_outputs(func(*args, **kwargs), False)
        host_args = [HOST if _device_arg(a) is not None and not isinstance(a, torch.Tensor) else a for a in args]
        host_kwargs = {k: (HOST if k == "device" else v) for k, v in kwargs.items()}
        if func is torch.Tensor.cuda:
            host_args, host_kwargs = [source], {}
            func = torch.Tensor.cpu
        out = func(*host_args, **host_kwargs)
        to_device = target.type == "cuda"
        if to_device != self.is_on_device(source):
            if self.is_on_device(source):
                self.syncs += 1  # device -> host waits for the device
            if out is source:  # the host op returned its input: a new tensor object is the other device's copy
                out = source.clone()
        return self.mark(out, to_device)

    def check_device_mix(self, func, args, kwargs) -> list[torch.Tensor]:
        """Raise as CUDA would when ``func``'s tensors are on two devices; returns the tensor arguments."""
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        on_device = [t for t in tensors if self.is_on_device(t)]
        if not on_device:
            return tensors
        generator = kwargs.get("generator")
        if isinstance(generator, torch._C.Generator) and not (isinstance(generator, DeviceGenerator)
                                                           and generator.device.type == "cuda"):
            raise DeviceMixError(f"{_name(func)}: Expected a 'cuda' device type for generator but found "
                                 f"'{generator.device.type}'")
        if func is torch.Tensor.copy_ or func in _METADATA:
            return tensors
        if func in _INDEXING:  # the tensor indexed and the values set must be on the device; indices may not
            values = args[2] if len(args) > 2 else kwargs.get("values", kwargs.get("value"))
            checked = [args[0]] + ([values] if isinstance(values, torch.Tensor) else [])
        else:
            checked = tensors
        for tensor in checked:
            if not self.is_on_device(tensor) and tensor.dim() > 0:
                raise DeviceMixError(f"{_name(func)}: Expected all tensors to be on the same device, but found at "
                                     f"least two devices, cuda:0 and cpu! (a host tensor of shape "
                                     f"{tuple(tensor.shape)})")
        return tensors


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class _Runtime:
    """``torch.cuda``'s runtime calls as one idle device answers them (a CPU build of torch has no CUDA runtime)."""

    def __init__(self) -> None:
        self.rng_state = torch.random.get_rng_state()

    def patches(self) -> dict[str, Any]:
        gib = 1 << 30
        return {
            "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
            "set_device": lambda device: None, "synchronize": lambda device=None: None,
            "get_device_name": lambda device=None: "FakeCuda (host memory)",
            "get_device_capability": lambda device=None: (9, 0),
            "get_rng_state": lambda device="cuda": self.rng_state.clone(),
            "set_rng_state": lambda state, device="cuda": None,
            "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
            "max_memory_allocated": lambda device=None: 0, "memory_allocated": lambda device=None: 0,
            "max_memory_reserved": lambda device=None: 0, "memory_reserved": lambda device=None: 0,
            "reset_peak_memory_stats": lambda device=None: None, "empty_cache": lambda: None,
            "mem_get_info": lambda device=None: (70 * gib, 80 * gib),
            "is_bf16_supported": lambda including_emulation=True: True,
            "get_device_properties": lambda device=None: SimpleNamespace(
                name="FakeCuda (host memory)", total_memory=80 * gib, major=9, minor=0, multi_processor_count=132),
        }


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeCuda]:
    """Run the body as if the machine had one CUDA device (see the module docstring); yields the mode."""
    patch = pytest_monkeypatch()
    for name, value in _Runtime().patches().items():
        patch.setattr(torch.cuda, name, value)
    patch.setattr(torch, "Generator", DeviceGenerator)
    mode = FakeCuda()
    original_run = threading.Thread.run

    def run_under_mode(thread: threading.Thread) -> None:  # torch function modes are per thread: enter it in each
        with mode:
            original_run(thread)

    patch.setattr(threading.Thread, "run", run_under_mode)
    try:
        with mode:
            yield mode
    finally:
        mode.active = False  # a thread started here that outlives the block computes as usual from now on
        patch.undo()


def pytest_monkeypatch():
    from _pytest.monkeypatch import MonkeyPatch

    return MonkeyPatch()
