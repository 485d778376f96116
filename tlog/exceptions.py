"""The transparency log's refusals (rendered by the one handler, config.errors)."""

from __future__ import annotations

from common.errors import ApplicationError


class LogNotFound(ApplicationError):
    code = "tlog_not_found"
    http_status = 404
    message = "No such log, or it has no checkpoint yet."


class StatementNotLogged(ApplicationError):
    code = "tlog_statement_not_found"
    http_status = 404
    message = "No statement with this id in this log."


class TileNotFound(ApplicationError):
    code = "tlog_tile_not_found"
    http_status = 404
    message = "No such tile in this log (yet)."
