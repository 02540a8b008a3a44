"""channels_redis's layer, for web processes that outlive a Redis restart and take their
messages from Redis in batches.

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

Batches: every consumer of a process receives through one Redis sorted set (the process's
``specific.<prefix>!`` channel), and channels_redis takes one message from it per four
sequential round trips (its cleanup script, BZPOPMIN, the ZADD to the backup, the ZPOPMIN that
clears it). On a busy host each round trip waits for the process (and Redis) to be scheduled
again: measured with 300 sessions running and 200 watchers on 2 cores, a few milliseconds each,
so a daphne took 15-30 messages a second from Redis while 20-30 waited there, and live pushes
were seconds late while its event loop sat idle in select. ``receive_single`` here takes every
waiting message (up to RECEIVE_BATCH) in one script and puts them in the local channels'
buffers in order; with nothing waiting it blocks on BZPOPMIN as channels_redis does. What a
cancelled receive had taken stays in the backup set and goes back in front on the next take,
as in channels_redis.

Sends: ``group_send_many`` sends one message to each of many groups (what the announcer does with a
batch of events) in two round trips per Redis host, where channels_redis's ``group_send`` makes four
sequential ones per group (expire and read the group, expire each channel's messages, store them):
one script reads every group's channels, another stores every message, in the order given.
"""

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

REJOINED = "layer.rejoined"  # the message a local channel gets after its groups were joined again
LOST = (RedisConnectionError, RedisTimeoutError, OSError)  # OSError: ConnectionError too
RECEIVE_BATCH = 200  # messages taken from the process's channel in one round trip

# ARGV: the channel's key, its backup key, how many. First what a cancelled receive left in the
# backup goes back in front (channels_redis's own cleanup), then up to ARGV[3] messages move to
# the backup and are returned (member, score, member, score...).
TAKE_SCRIPT = """
local backed_up = redis.call('ZRANGE', ARGV[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', ARGV[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', ARGV[2])
local taken = redis.call('ZPOPMIN', ARGV[1], ARGV[3])
for i = 1, #taken, 2 do
    redis.call('ZADD', ARGV[2], taken[i + 1], taken[i])
end
return taken
"""

# KEYS: the groups' keys; ARGV[1]: members joined at or before it have expired. Returns each
# group's channels, in KEYS order.
GROUPS_SCRIPT = """
local members = {}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[1])
    members[i] = redis.call('ZRANGE', KEYS[i], 0, -1)
end
return members
"""

# KEYS: a channel key per message (a key repeats when several messages go to it). ARGV: the n
# messages, their channels' capacities, their scores (rising: ZPOPMIN takes the lowest first), then
# the score at or below which a waiting message has expired, and the keys' expiry in seconds. As
# channels_redis's group_send: expired messages go first, a message to a full channel is dropped
# (and counted in the reply).
SEND_SCRIPT = """
local n = #KEYS
local expired = ARGV[3 * n + 1]
local expiry = ARGV[3 * n + 2]
local over = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired)
    if redis.call('ZCARD', KEYS[i]) < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], ARGV[2 * n + i], ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over = over + 1
    end
end
return over
"""
SCORE_STEP = 1e-6  # between the scores of one send's messages (a float near 1.7e9 keeps ~0.2 µs)


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

    async def group_send_many(self, messages: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """``group_send(group, message)`` for each pair, in two round trips per Redis host (the
        groups' channels, then every message stored), the messages to one channel in the given
        order. Groups nobody is in cost nothing past the first round trip."""
        by_host: dict[int, list[int]] = {}
        for n, (group, _) in enumerate(messages):
            assert self.require_valid_group_name(group), "Group name not valid"
            by_host.setdefault(self.consistent_hash(group), []).append(n)
        joined_after = int(time.time()) - self.group_expiry
        members: list[list[str]] = [[] for _ in messages]

        async def read(index: int, ns: list[int]) -> None:
            keys = [self._group_key(messages[n][0]) for n in ns]
            got = await self.connection(index).eval(GROUPS_SCRIPT, len(keys), *keys, joined_after)
            for n, names in zip(ns, got, strict=True):
                members[n] = [name.decode("utf8") for name in names]

        await asyncio.gather(*(read(index, ns) for index, ns in by_host.items()))
        # Per channel host: each message's channel key, its serialized copy for that key, the capacity.
        sends: dict[int, tuple[list[Any], list[bytes], list[int]]] = {}
        for (_, message), names in zip(messages, members, strict=True):
            if not names:
                continue
            keys_by_host, payloads, capacities = self._map_channel_keys_to_connection(names, message)
            for index, keys in keys_by_host.items():
                entry = sends.setdefault(index, ([], [], []))
                for key in keys:
                    entry[0].append(key)
                    entry[1].append(payloads[key])
                    entry[2].append(capacities[key])
        now = time.time()

        async def store(index: int, keys: list[Any], payloads: list[bytes], capacities: list[int]) -> None:
            scores = [repr(now + n * SCORE_STEP) for n in range(len(keys))]
            over = await self.connection(index).eval(SEND_SCRIPT, len(keys), *keys, *payloads, *capacities, *scores,
                                                     int(now) - int(self.expiry), int(self.expiry))
            if over:
                log.info("%s of %s messages dropped: their channels were over capacity", over, len(keys))

        await asyncio.gather(*(store(index, *entry) for index, entry in sends.items()))

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

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        """For the process's channel: every waiting message, in order, into the local channels'
        buffers (``receive`` then finds its own there); returns an empty channel list, so that
        channels_redis's ``receive`` buffers nothing more. Other channels: channels_redis's."""
        if not channel.endswith("!"):
            return await super().receive_single(channel)
        assert self.require_valid_channel_name(channel, receive=True), "Channel name invalid"
        index = self.consistent_hash(channel)
        key = self.prefix + channel
        backup = self._backup_channel_name(key)
        await self.receive_clean_locks.acquire(key)
        try:
            taken = await self.connection(index).eval(TAKE_SCRIPT, 0, key, backup, RECEIVE_BATCH)
            contents = list(taken[::2])
            while not contents:  # nothing waiting: block as channels_redis does (its cleanup first)
                member = await self._brpop_with_clean(index, key, timeout=self.brpop_timeout)
                if member is not None:
                    contents = [member]
        except BaseException:
            self.receive_clean_locks.release(key)
            raise
        # From here to the return nothing awaits: the messages are buffered before anything else
        # runs, so the backup's copies can go (the lock keeps the next take waiting until then).
        cleaner = asyncio.ensure_future(self.connection(index).zpopmin(backup, len(contents)))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Future[Any]) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(key)

        cleaner.add_done_callback(cleaned)
        for content in contents:
            message = self.deserialize(content)
            target = message.pop("__asgi_channel__", channel)
            for name in target if isinstance(target, list) else [target]:
                self.receive_buffer[name].put_nowait(message)
        return [], {}

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
