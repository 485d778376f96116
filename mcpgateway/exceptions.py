"""The gateway's domain failures (rendered by the one error handler, ``common.errors``)."""

from __future__ import annotations

from rest_framework import status

from common.errors import ApplicationError


class ToolSchemaUnusable(ApplicationError):
    """The tool's inputSchema cannot be used to validate arguments, so no call of it is accepted.

    422: the call cannot be processed as the tool is listed; it is refused before anything is
    accepted or charged (docs/decisions.md, "Receipts and the governed call").
    """

    code = "tool_schema_unusable"
    http_status = status.HTTP_422_UNPROCESSABLE_ENTITY
    message = "The tool's inputSchema cannot be used to validate arguments; the tool cannot be called."
