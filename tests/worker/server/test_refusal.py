"""A worker at its maximum of sessions refuses a new one with RESOURCE_EXHAUSTED, every time.

A refusal sent before the client's first message lands races the client's
write, and grpc's asyncio client then reports INTERNAL ("Internal error from
Core", grpc/grpc#36066): a coordinator would read a full worker as a broken
one. Measured before the worker read the Open first: 3 of 300 refused opens
came back INTERNAL, so this check of 300 fails about 95% of the time if
the race returns. How promptly a busy worker refuses is timed in
``test_busy_worker.py``.
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest

from specwire.models.loading import LoadedModel
from specwire.wire.protocol import DRAFT_METHOD
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request, refused_open
from tests.support.processes.workers import running_worker, unique_name

REFUSED_OPENS = 300


@pytest.mark.anyio
async def test_every_session_past_the_maximum_is_refused_as_resource_exhausted(tiny: LoadedModel) -> None:
    args = ("--model", "tiny", "--name", unique_name("full-worker"), "--max-sessions", "1", "--no-advertise")
    with running_worker(*args) as worker:
        async with worker_channel(worker.address) as channel:
            held = channel.stream_stream(DRAFT_METHOD)(timeout=120)
            await held.write(open_request(tiny.fingerprint, k=2))
            await held.read()  # opened: the worker's one session is taken
            codes: Counter[grpc.StatusCode] = Counter()
            for _ in range(REFUSED_OPENS):
                code, _ = await refused_open(channel, tiny.fingerprint, timeout=30)
                codes[code] += 1
            held.cancel()
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED: REFUSED_OPENS}, codes
