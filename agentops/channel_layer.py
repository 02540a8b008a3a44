"""channels_redis's layer, for web processes that outlive a Redis restart.

Redis holds the group memberships. A restart (or a flush, or a failover to an empty replica)
forgets them while the process's WebSocket and SSE consumers stay connected: they would never
get their session's events again, and, having no later event to reveal a gap, never ask. And the
consumer whose ``receive`` was blocked on Redis when it went away died with a ConnectionError
(daphne closed its socket, 1011). Here:

- ``receive`` waits for Redis to come back instead of raising;
- the layer remembers which of this process's channels joined which group, and checks every
  ``AGENTOPS_LAYER_CHECK_SECONDS`` (and at once after a lost connection) an epoch key it set in
  each Redis: when the key is gone or another process replaced it, Redis lost its data, so the
  layer joins every remembered group again and puts a ``layer.rejoined`` message in each local
  channel's buffer: the consumer re-reads from the database what it may have missed (the events
  committed while nobody was in the group), then goes on live.
"""

import asyncio
import logging
import os
import uuid
from typing import Any

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

REJOINED = "layer.rejoined"  # the message a local channel gets after its groups were joined again
LOST = (RedisConnectionError, RedisTimeoutError, OSError)  # OSError: ConnectionError too


def check_seconds() -> float:
    return float(os.environ.get("AGENTOPS_LAYER_CHECK_SECONDS", "1.0"))


class RedisChannelLayer(BaseRedisChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.joined: dict[str, set[str]] = {}  # group → this process's channels in it
        self.epochs: dict[int, str] = {}  # Redis host index → the epoch token last seen there
        self._watch: asyncio.Task[None] | None = None
        self._lost = False  # a receive lost its connection: check at once (a flag: loops come and go in tests)

    def _local(self, channel: str) -> bool:
        return "!" in channel and channel.split("!", 1)[0].endswith(self.client_prefix)

    async def group_add(self, group: str, channel: str) -> None:
        await super().group_add(group, channel)
        if self._local(channel):
            self.joined.setdefault(group, set()).add(channel)
            self._start_watch()

    async def group_discard(self, group: str, channel: str) -> None:
        members = self.joined.get(group)
        if members is not None:
            members.discard(channel)
            if not members:
                del self.joined[group]
        try:
            await super().group_discard(group, channel)
        except LOST as exc:  # Redis away: the membership went with it, or expires
            log.info("group_discard of %s while Redis is away: %s", group, exc)

    async def receive(self, channel: str) -> dict[str, Any]:
        backoff = 0.05
        while True:
            try:
                message: dict[str, Any] = await super().receive(channel)
                return message
            except LOST as exc:
                log.warning("channel layer receive lost Redis (%s); waiting for it", exc)
                self._lost = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _start_watch(self) -> None:
        loop = asyncio.get_running_loop()
        if self._watch is None or self._watch.done() or self._watch.get_loop() is not loop:
            self._watch = loop.create_task(self._watch_epochs())

    async def _watch_epochs(self) -> None:
        while self.joined:
            try:
                await self.check_epochs()
            except LOST as exc:
                self._lost = True
                log.info("channel layer epoch check: Redis away (%s)", exc)
            except Exception:
                log.exception("channel layer epoch check failed")
            else:
                self._lost = False
            # Sleep until the next check, or less when a receive lost its connection meanwhile.
            deadline = asyncio.get_running_loop().time() + check_seconds()
            await asyncio.sleep(0.1)
            while not self._lost and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)

    async def check_epochs(self) -> None:
        """Did any Redis lose its data since the last check? If so, join every remembered group
        again and tell each local channel (``layer.rejoined``)."""
        key = f"{self.prefix}:agentops-epoch"
        lost = False
        for index in range(self.ring_size):
            connection = self.connection(index)
            pipe = connection.pipeline(transaction=False)
            pipe.set(key, uuid.uuid4().hex, nx=True)
            pipe.get(key)
            _, raw = await pipe.execute()
            token = raw.decode() if isinstance(raw, bytes) else str(raw)
            seen = self.epochs.get(index)
            self.epochs[index] = token
            if seen is not None and seen != token:
                lost = True
        if lost:
            await self.rejoin()

    async def rejoin(self) -> None:
        groups = {group: set(channels) for group, channels in self.joined.items()}
        for group, channels in groups.items():
            for channel in channels:
                await super().group_add(group, channel)
        channels = {channel for members in groups.values() for channel in members}
        log.warning("Redis lost the channel layer's groups: %d groups of %d local channels joined again",
                    len(groups), len(channels))
        for channel in channels:
            self.receive_buffer[channel].put_nowait({"type": REJOINED})
