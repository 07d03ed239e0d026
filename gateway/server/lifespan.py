"""Start-up refusals: one error line, no traceback.

The gateway refuses to start on configuration an operator must fix (a schema behind with
migrations off, a damaged database file, an instance id another live process uses, a database
URL it cannot use). Starlette hands a failed start-up to the server with the whole traceback,
which uvicorn logs, followed by a line of its own. For a refusal the reason is the whole story:
the lifespan here logs it as one line ("not starting: ...") and nothing else; any other
failure keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from uvicorn.lifespan.on import LifespanOn, LifespanSendMessage

from gateway.protocol.error_codes import CodedError

log = logging.getLogger("gateway")


class StartupRefused(CodedError):
    """The gateway will not start with this configuration; the message says why and what to
    change."""


class GatewayLifespan(LifespanOn):
    refused = False

    async def send(self, message: LifespanSendMessage) -> None:
        if message["type"] == "lifespan.startup.failed":
            # Sent from inside the application's `except` block: the failure is the exception
            # being handled.
            failure = sys.exc_info()[1]
            if isinstance(failure, StartupRefused):
                self.refused = True
                log.error("not starting: %s", failure)
                message = {"type": "lifespan.startup.failed", "message": ""}
        await super().send(message)

    async def startup(self) -> None:
        # uvicorn's own, but silent after a refusal: its "Application startup failed.
        # Exiting." would only repeat it.
        self.logger.info("Waiting for application startup.")
        self._main = asyncio.get_running_loop().create_task(self.main())
        await self.receive_queue.put({"type": "lifespan.startup"})
        await self.startup_event.wait()
        if self.refused:
            self.should_exit = True
        elif self.startup_failed or (self.error_occurred and self.config.lifespan == "on"):
            self.logger.error("Application startup failed. Exiting.")
            self.should_exit = True
        else:
            self.logger.info("Application startup complete.")

    async def shutdown(self) -> None:
        if not self.refused:
            await super().shutdown()
