"""The client for the configured upstream MCP server, by concern (docs/decisions.md, Foundation).

- ``client``: ``UpstreamClient`` (era negotiation, ``tools/call`` classification), ``CallResult``,
  ``UpstreamSession``, ``UpstreamError``.
- ``protocol``: MCP names and versions, JSON-RPC message matching, the stateless revision's header values.
- ``validators``: the outputSchema validators (``output_schema_problem``).
- ``sse``: server-sent events, the body in bounded chunks.
- ``http``: HTTP/1.1 over a pool of kept-alive connections, the TLS context, transport errors.

Callers import from the module that holds a name; this package re-exports nothing.
"""
