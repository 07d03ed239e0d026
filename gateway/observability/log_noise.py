"""Log records any client could force, made quiet (gateway/observability/log_config.py puts the
filter on uvicorn's error logger).

uvicorn logs a full traceback at ERROR for every text frame that is not valid UTF-8 (it then
closes the socket, `CloseCode.INVALID_PAYLOAD`, which is all the event deserves). Any client,
before it has even authenticated, could fill the logs and page an operator that way; such a
record becomes one INFO line without the traceback.
"""

from __future__ import annotations

import logging

CLIENT_CAUSED_MESSAGES = frozenset({"Invalid UTF-8 sequence received from client."})


class ClientCausedErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() in CLIENT_CAUSED_MESSAGES:
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.INFO
            record.levelname = logging.getLevelName(logging.INFO)
        return True
