"""The one thread a trigger's broker calls run on: broker clients are blocking, the triggerer's event loop is not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..hooks import get_hook

__all__ = ["BrokerThread"]

T = TypeVar("T")


class BrokerThread:
    """One thread that owns a hook: broker clients are created once and only ever used from it (some
    clients, like pika's, must not be shared between threads)."""

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="babelqueue-trigger")
        self._hook: Any = None

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        if self._hook is None:
            self._hook = get_hook(self.conn_id)
        return fn(self._hook.get_binding(), *args, **kwargs)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn, args, kwargs)

    def close(self) -> None:
        hook = self._hook
        if hook is not None:
            self._executor.submit(hook.close)
        self._executor.shutdown(wait=False)
