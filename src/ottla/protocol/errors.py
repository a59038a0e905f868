"""What can be wrong with what a peer sent; the network layer closes the connection for each."""


class ProtocolViolation(Exception):
    """The peer broke the protocol; Kafka closes the connection."""


class FrameTooLarge(ProtocolViolation):
    pass


class MalformedRequest(ProtocolViolation):
    pass


class UnknownApi(ProtocolViolation):
    pass


class UnsupportedApiVersion(ProtocolViolation):
    """A known API at a version we do not serve. Only ApiVersions gets an answer."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int):
        super().__init__(f"unsupported version {api_version} of API {api_key}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
