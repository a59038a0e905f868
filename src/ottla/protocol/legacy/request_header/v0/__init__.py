from .header import RequestHeader

__all__ = (
    "RequestHeader",
)
