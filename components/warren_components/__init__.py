"""Warren's Pulumi components (docs/architecture.md, the parts; docs/pulumi.md)."""

from warren_components.aws_sandbox_cluster import AwsSandboxCluster, AwsSandboxClusterArgs
from warren_components.database import Database, DatabaseArgs
from warren_components.edge import WarrenEdge, WarrenEdgeArgs
from warren_components.forkd_user_data import ForkdHost
from warren_components.kvm_host_pool import IngressFrom, KvmHostPool, KvmHostPoolArgs
from warren_components.node_user_data import GvisorBinaries
from warren_components.object_store import ObjectStore, ObjectStoreArgs
from warren_components.object_store_access import ObjectStoreAccess, ObjectStoreAccessArgs
from warren_components.platform import WarrenPlatform, WarrenPlatformArgs

__all__ = [
    "AwsSandboxCluster",
    "AwsSandboxClusterArgs",
    "Database",
    "DatabaseArgs",
    "ForkdHost",
    "GvisorBinaries",
    "IngressFrom",
    "KvmHostPool",
    "KvmHostPoolArgs",
    "ObjectStore",
    "ObjectStoreAccess",
    "ObjectStoreAccessArgs",
    "ObjectStoreArgs",
    "WarrenEdge",
    "WarrenEdgeArgs",
    "WarrenPlatform",
    "WarrenPlatformArgs",
]
