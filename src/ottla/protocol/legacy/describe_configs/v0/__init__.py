from .request import DescribeConfigsRequest
from .response import DescribeConfigsResponse

__all__ = (
    "DescribeConfigsRequest",
    "DescribeConfigsResponse",
)
