"""The transparency log's refusals (rendered by the one handler, config.errors): 404 ``not_found``, each saying what."""

from __future__ import annotations

from common.errors import NotFound


class LogNotFound(NotFound):
    message = "No such log, or it has no checkpoint yet."


class StatementNotLogged(NotFound):
    message = "No statement with this id in this log."


class TileNotFound(NotFound):
    message = "No such tile in this log (yet)."
