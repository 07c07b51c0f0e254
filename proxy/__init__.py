"""asyncio I/O: listeners, pipelines, upstream connections, admin HTTP."""
