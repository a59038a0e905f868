"""The seam where ACLs will plug in; today every principal may do everything.

Handlers ask before acting, under Kafka's operation and resource names, so a real
authorizer can be dropped in without touching them. The idempotent producer needs
IDEMPOTENT_WRITE on the cluster for InitProducerId without a transactional id.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple, Protocol

from ..errors import ErrorCode, KafkaError

CLUSTER_NAME = "kafka-cluster"  # the one cluster resource's name in Kafka ACLs


class Operation(Enum):
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class ResourceType(Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"
    TRANSACTIONAL_ID = "TransactionalId"


class Resource(NamedTuple):
    type: ResourceType
    name: str


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


class Authorizer(Protocol):
    def authorize(self, principal: str, operation: Operation, resource: Resource) -> bool: ...


class AllowAllAuthorizer:
    """No ACLs configured: Kafka's behaviour without an authorizer."""

    def authorize(self, principal: str, operation: Operation, resource: Resource) -> bool:
        return True


def require_idempotent_write(authorizer: Authorizer, principal: str) -> None:
    """Raise CLUSTER_AUTHORIZATION_FAILED unless `principal` may produce idempotently."""
    if not authorizer.authorize(principal, Operation.IDEMPOTENT_WRITE, CLUSTER):
        raise KafkaError(
            ErrorCode.cluster_authorization_failed, f"{principal} lacks IdempotentWrite on the cluster"
        )
