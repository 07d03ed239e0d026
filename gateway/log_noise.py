"""Logging configuration for `python -m gateway serve`: uvicorn's, minus what clients can force.

uvicorn logs a full traceback at ERROR for every text frame that is not valid UTF-8 (it then
closes the socket with 1007, which is all the event deserves). Any client, before it has even
authenticated, could fill the logs and page an operator that way; such a record becomes one
INFO line without the traceback.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

CLIENT_CAUSED_MESSAGES = frozenset({"Invalid UTF-8 sequence received from client."})


class ClientCausedErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() in CLIENT_CAUSED_MESSAGES:
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.INFO
            record.levelname = logging.getLevelName(logging.INFO)
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own default logging configuration with the filter on its error logger."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["client_caused_errors"] = {"()": ClientCausedErrors}
    error_logger = config["loggers"].setdefault("uvicorn.error", {})
    error_logger.setdefault("filters", []).append("client_caused_errors")
    return config
