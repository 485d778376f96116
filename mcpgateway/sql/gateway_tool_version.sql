-- gateway_tool_version: the version of a tool's row, changed by any change to it.
--
-- Where the row's current version lives and which transaction wrote it (xmin:ctid): any
-- UPDATE of the row, however it is made (the registry's sync, the console, plain SQL),
-- writes a new row version elsewhere. The governed call caches tools per process by this
-- version (mcpgateway.services.tools._registered_tool), reads it in every call's lookup and
-- compares it again in the claim (gateway_claim) when the call was authorized from the
-- cache. NULL when there is no such tool.
CREATE OR REPLACE FUNCTION gateway_tool_version(p_tool text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT t.xmin::text || ':' || t.ctid::text FROM mcpgateway_tool t WHERE t.service_id = p_tool;
$$;
