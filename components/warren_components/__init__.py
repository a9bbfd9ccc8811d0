"""Warren's Pulumi components (ARCHITECTURE.md, "How it is installed")."""

from warren_components.aws_sandbox_cluster import AwsSandboxCluster, AwsSandboxClusterArgs
from warren_components.database import Database, DatabaseArgs
from warren_components.forkd_user_data import ForkdHost
from warren_components.kvm_host_pool import IngressFrom, KvmHostPool, KvmHostPoolArgs
from warren_components.node_user_data import GvisorBinaries
from warren_components.object_store import ObjectStore, ObjectStoreArgs
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
    "ObjectStoreArgs",
    "WarrenPlatform",
    "WarrenPlatformArgs",
]
