"""Looking inside a model. ``explore()`` (``bertlab explore``): one sentence through the model,
shown as a self-contained page of every layer and head (payload.py takes the numbers from the
forward pass, graph.py records the network as called, page.py assembles the page from
``static/``, serve.py serves it with a text box); the parameter table (``bertlab summary``,
summary.py) and the embedding layer taken apart (``bertlab inspect embeddings``, dissect.py).
Imports the network, the tokenizer and io; nothing imports it but the commands and the public
API.

The package itself can be called: ``bertlab.explore("a sentence")`` is ``explore()``, while
``bertlab.explore.payload`` and the other modules stay importable under their names.
"""

import sys
import types

from bertlab.explore.page import Exploration, explore
from bertlab.explore.payload import build_payload

__all__ = ["Exploration", "build_payload", "explore"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs) -> Exploration:
        return explore(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
