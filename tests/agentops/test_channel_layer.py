"""The channel layer takes a process's waiting messages from Redis in one round trip, in order,
and loses none that a cancelled receive had taken (real Redis, a key prefix of the test's own)."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from django.conf import settings

from agentops.channel_layer import RECEIVE_BATCH, TAKE_SCRIPT, RedisChannelLayer


@pytest.fixture
async def layer() -> AsyncIterator[RedisChannelLayer]:
    layer = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=f"test-layer-{uuid.uuid4().hex[:8]}", expiry=60,
                              capacity=1000)
    try:
        yield layer
    finally:
        await layer.flush()


def process_key(layer: RedisChannelLayer, channel: str) -> str:
    return layer.prefix + layer.non_local_name(channel)


async def waiting_in_redis(layer: RedisChannelLayer, channel: str) -> int:
    key = process_key(layer, channel)
    connection = layer.connection(layer.consistent_hash(layer.non_local_name(channel)))
    return int(await connection.zcard(key)) + int(await connection.zcard(key + "$inflight"))


async def receive_all(layer: RedisChannelLayer, channel: str, count: int) -> list[int]:
    return [(await asyncio.wait_for(layer.receive(channel), 5))["n"] for _ in range(count)]


async def test_one_receive_takes_every_waiting_message_and_each_channel_gets_its_own_in_order(
        layer: RedisChannelLayer) -> None:
    a, b, c = [await layer.new_channel() for _ in range(3)]
    await layer.group_add("watchers", a)
    await layer.group_add("watchers", c)
    for n, target in enumerate((a, b, a, "watchers", b, a), start=1):
        if target == "watchers":
            await layer.group_send("watchers", {"type": "event.message", "n": n})
        else:
            await layer.send(target, {"type": "event.message", "n": n})
    assert await waiting_in_redis(layer, a) == 6  # one message for both of the group's channels

    assert await receive_all(layer, a, 1) == [1]
    await layer.wait_received()
    assert await waiting_in_redis(layer, a) == 0  # the rest was taken with it: buffered, not left in Redis

    assert await receive_all(layer, a, 3) == [3, 4, 6]
    assert await receive_all(layer, b, 2) == [2, 5]
    assert await receive_all(layer, c, 1) == [4]


async def test_more_than_a_batch_arrives_complete_and_in_order(layer: RedisChannelLayer) -> None:
    channel = await layer.new_channel()
    total = RECEIVE_BATCH * 2 + 7
    for n in range(total):
        await layer.send(channel, {"type": "event.message", "n": n})
    assert await receive_all(layer, channel, total) == list(range(total))


async def test_a_receive_that_waits_gets_a_message_sent_later(layer: RedisChannelLayer) -> None:
    channel = await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await layer.send(channel, {"type": "event.message", "n": 1})
    assert (await asyncio.wait_for(waiting, 5))["n"] == 1


async def test_what_a_cancelled_take_moved_to_the_backup_is_received_first(layer: RedisChannelLayer) -> None:
    channel = await layer.new_channel()
    for n in range(3):
        await layer.send(channel, {"type": "event.message", "n": n})
    key = process_key(layer, channel)
    connection = layer.connection(layer.consistent_hash(layer.non_local_name(channel)))
    # A take whose reply never reached the process (its receive was cancelled): the messages sit
    # in the backup set only.
    taken = await connection.eval(TAKE_SCRIPT, 0, key, key + "$inflight", 2)
    assert len(taken) == 4 and await connection.zcard(key) == 1
    await layer.send(channel, {"type": "event.message", "n": 3})

    assert await receive_all(layer, channel, 4) == [0, 1, 2, 3]
    await layer.wait_received()
    assert await waiting_in_redis(layer, channel) == 0


async def test_group_send_many_reaches_every_groups_channels_in_order_as_group_send_does(
        layer: RedisChannelLayer) -> None:
    other = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=layer.prefix, expiry=60, capacity=1000)
    a, b = [await layer.new_channel() for _ in range(2)]
    c = await other.new_channel()  # a channel of another process: a key of its own
    await layer.group_add("one", a)
    await layer.group_add("one", c)
    await layer.group_add("two", a)
    await layer.group_add("two", b)
    await layer.group_send_many([("one", {"type": "m", "n": 1}), ("two", {"type": "m", "n": 2}),
                                 ("nobody", {"type": "m", "n": 0})])
    await layer.group_send_many([("two", {"type": "m", "n": 3}), ("one", {"type": "m", "n": 4})])
    await layer.group_send("one", {"type": "m", "n": 5})  # the two ways interleave in order

    assert await receive_all(layer, a, 5) == [1, 2, 3, 4, 5]
    assert await receive_all(layer, b, 2) == [2, 3]
    assert await receive_all(other, c, 3) == [1, 4, 5]
    await layer.wait_received()
    await other.wait_received()
    assert await waiting_in_redis(layer, a) == 0 and await waiting_in_redis(other, c) == 0


async def test_group_send_many_drops_what_a_full_channel_cannot_take_and_skips_expired_members(
        layer: RedisChannelLayer) -> None:
    small = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=layer.prefix, expiry=60, capacity=2)
    full, gone = [await small.new_channel() for _ in range(2)]
    await small.group_add("g", full)
    connection = small.connection(small.consistent_hash("g"))
    # A member that joined longer ago than group_expiry: left out (and removed), as group_send does.
    await connection.zadd(small._group_key("g"), {gone: int(time.time()) - small.group_expiry - 5})
    await small.group_send_many([("g", {"type": "m", "n": n}) for n in range(4)])

    assert await receive_all(small, full, 2) == [0, 1]  # capacity 2: the third and fourth dropped
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(small.receive(full), 0.3)
    assert await connection.zrange(small._group_key("g"), 0, -1) == [full.encode()]
