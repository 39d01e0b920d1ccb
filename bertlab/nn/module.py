"""The base class of bertlab's modules: ``nn.Module``, its registered names read as quickly as
ordinary attributes. A leaf: it imports nothing of bertlab.

nn.Module keeps submodules, parameters and buffers in tables of its own (``_modules``,
``_parameters``, ``_buffers``) and finds them in its ``__getattr__``, which Python calls only
after the ordinary lookup has failed. Before Python 3.12 that failure builds an AttributeError,
message and all, every time: ``self.dense`` in a forward cost 0.6-0.9 us, four to six times
the 0.15 us it takes through ``Registered`` below, and one sentence through the bundled model's
six layers made 125 such reads (tests/test_module.py counts them: none now).

So when a ``Module`` registers a name by assignment (``self.dense = nn.Linear(...)``), its class
gets a ``Registered`` attribute of that name, unless the class already has one. It reads the same
tables as nn.Module's ``__getattr__``, at each read, so it returns whatever is registered at
that moment: a module replaced (``setattr``, ``add_module``, or ``_modules`` written
directly, as adapters do), set to None or deleted. It is a non-data descriptor, so an entry of
that name in an instance's own ``__dict__`` still comes first. Nothing else changes: the class of
every module, state dicts, hooks, copies and pickles, torch.compile and export.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class Registered:
    """A class attribute that reads a registered submodule, parameter or buffer of the instance:
    ``_modules`` first, then ``nn.Module.__getattr__`` called directly. (nn.Module keeps a name
    in one of its tables at a time, so the order of the tables does not matter.)"""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __get__(self, module: nn.Module | None, owner: type | None = None) -> Any:
        if module is None:  # read on the class itself
            return self
        modules, name = module._modules, self.name
        if name in modules:  # (a submodule: the common case, read in one step)
            return modules[name]
        return nn.Module.__getattr__(module, name)  # a parameter or a buffer, or the error

    def __repr__(self) -> str:
        return f"Registered({self.name!r})"


class Module(nn.Module):
    """nn.Module whose registered names are read without the failed lookup (module docstring)."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        tables = self.__dict__  # (read directly: nn.Module may set attributes before its tables)
        registered = any(name in tables.get(t, ()) for t in ("_modules", "_parameters", "_buffers"))
        if registered and not hasattr(type(self), name):
            setattr(type(self), name, Registered(name))
