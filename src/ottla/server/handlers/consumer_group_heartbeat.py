"""ConsumerGroupHeartbeat (KIP-848): answered UNSUPPORTED_VERSION until the new protocol exists.

Kafka brokers whose group coordinator does not run the consumer protocol answer exactly
this, and a librdkafka consumer with group.protocol=consumer turns it into a fatal error
naming the problem, instead of waiting forever for an assignment no one will send.
"""

from datetime import timedelta

from ...errors import ErrorCode
from ...protocol.build import make

API_KEY = 68
VERSIONS = (0, 1)

_MESSAGE = ("The new consumer group protocol (KIP-848, group.protocol=consumer) is not supported by this "
            "broker; use group.protocol=classic")


async def handle(ctx, request):
    return make(ctx.response_type, throttle_time=timedelta(0), error_code=ErrorCode.unsupported_version,
                error_message=_MESSAGE, member_id=None, member_epoch=-1, heartbeat_interval=timedelta(0),
                assignment=None)
