"""asyncio I/O: listeners, pipelines, upstream connections, admin HTTP."""

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)
