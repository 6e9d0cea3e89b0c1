"""Text work off the event loop: tokenizing, detokenizing and chat templating run on a small pool of
their own threads, so a long prompt never delays /health or another request's stream.

The pool is small on purpose (TEXT_THREADS): text work is bounded by the input limits, and a burst
of large prompts queues here instead of taking every thread the HTTP server has.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

TEXT_THREADS = 2


class TextPool:
    def __init__(self, threads: int = TEXT_THREADS):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="calculet-text")

    async def run(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` on a pool thread; its exception (a RequestError, say) is raised here."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
