"""The tool gateway's writes: the governed call (docs/architecture.md), the tool registry and the sweeper.

One module per idea: ``tools`` (the registry, and the process's cache of tool rows), ``call`` (a
call's request and answer), ``lookup`` (what a call is decided on: one round trip, or the process's
caches), the call's phases ``claim`` (1), ``dispatch`` (2, with the process's upstream client) and
``finish`` (3, and the settlement every action that ends goes through), ``governed``
(``governed_call``: the phases in order) and ``sweeper``. ``tools`` and ``call`` import no other
module of the package, ``governed`` is imported by none, and no module imports one that imports it
back. This package names their public services, so callers import from ``mcpgateway.services``.
"""

from mcpgateway.services.call import (
    OUTCOME_STATUS,
    CallAnswer,
    CallRequest,
    request_document,
    request_hash_of,
)
from mcpgateway.services.claim import CLAIM_REFUSED
from mcpgateway.services.dispatch import upstream_client
from mcpgateway.services.governed import RETRY_AFTER_SECONDS, governed_call
from mcpgateway.services.lookup import CACHE_LIMIT
from mcpgateway.services.sweeper import action_sweep, mcp_sessions_purge, sweep_threshold
from mcpgateway.services.tools import (
    DOGFOOD_TOOL,
    SyncReport,
    dogfood_tool_register,
    tool_get,
    tool_is_callable,
    tool_is_listed,
    tool_schema_problem,
    tool_update,
    tools_catalog,
    tools_sync,
)

__all__ = [
    "CACHE_LIMIT",
    "CLAIM_REFUSED",
    "DOGFOOD_TOOL",
    "OUTCOME_STATUS",
    "RETRY_AFTER_SECONDS",
    "CallAnswer",
    "CallRequest",
    "SyncReport",
    "action_sweep",
    "dogfood_tool_register",
    "governed_call",
    "mcp_sessions_purge",
    "request_document",
    "request_hash_of",
    "sweep_threshold",
    "tool_get",
    "tool_is_callable",
    "tool_is_listed",
    "tool_schema_problem",
    "tool_update",
    "tools_catalog",
    "tools_sync",
    "upstream_client",
]
