"""Drop-ins for the agent frameworks users run, each behind its own extra.

- :mod:`flowmem.integrations.langchain` (``pip install 'flowmem[langchain]'``):
  :class:`~flowmem.integrations.langchain.FlowmemChatMessageHistory`, a
  LangChain ``BaseChatMessageHistory`` over :class:`~flowmem.Memory` or
  :class:`~flowmem.AsyncMemory`, and the lossless LangChain message mapping.
- :mod:`flowmem.integrations.langgraph` (``[langgraph]``):
  :func:`~flowmem.integrations.langgraph.add_messages`, a drop-in for
  LangGraph's reducer that adds the GR-MEM rules (MEM-1/2/3/10).
- :mod:`flowmem.integrations.agents` (``[agents]``):
  :class:`~flowmem.integrations.agents.FlowmemSession`, an OpenAI Agents SDK
  ``Session`` over :class:`~flowmem.AsyncMemory`.

Importing :mod:`flowmem` (or this package) never imports a framework: each
submodule imports its framework when it is itself imported, and raises
:class:`~flowmem.errors.MissingDependency` naming the extra when it is absent.
Integrations use only :class:`~flowmem.Memory`/:class:`~flowmem.AsyncMemory`,
the pure core and :mod:`flowmem.formats` — never a store.
"""

from __future__ import annotations

__all__: list[str] = []
