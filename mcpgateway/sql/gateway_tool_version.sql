-- gateway_tool_version: the version of a tool's row and of its upstream server's, changed by any change to either.
--
-- Where the rows' current versions live and which transactions wrote them (xmin:ctid): any
-- UPDATE of the tool's row or of its server's (mcpgateway_upstream_server: enabled, the
-- tenants it is open to, its URL, timeouts or credentials version), however it is made (the
-- registry's sync, the console, the operator API, plain SQL), writes a new row version
-- elsewhere. The governed call caches tools per process, with their server, by this version
-- (mcpgateway.services.tools._registered_tool), reads it in every call's lookup and compares
-- it again in the claim (gateway_claim), so a call is never authorized on a server row that
-- changed since it was read. NULL when there is no such tool.
CREATE OR REPLACE FUNCTION gateway_tool_version(p_tool text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT t.xmin::text || ':' || t.ctid::text || coalesce('/' || s.xmin::text || ':' || s.ctid::text, '')
      FROM mcpgateway_tool t
      LEFT JOIN mcpgateway_upstream_server s ON s.server_id = t.server_id
     WHERE t.service_id = p_tool;
$$;
