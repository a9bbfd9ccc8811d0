"""What each target deploys, composed from the components.

local: the platform's objects on an existing cluster (the one `warren cluster up` runs), as
       the stack's warren configuration renders them (Warren's services as workloads when it
       enables them).
aws:   a VPC and EKS cluster with gVisor nodes, the workspace bucket, PostgreSQL, KVM hosts,
       and the whole platform on the new cluster: the floor and Warren's services, on the
       stack's own database and bucket, reached through a load balancer; the API's URL is an
       output.
"""

from __future__ import annotations

import pulumi_aws as aws
from stack_settings import AwsSettings, LocalSettings, StackSettings
from warren_components import (
    AwsSandboxCluster,
    AwsSandboxClusterArgs,
    Database,
    DatabaseArgs,
    IngressFrom,
    KvmHostPool,
    KvmHostPoolArgs,
    ObjectStore,
    ObjectStoreAccess,
    ObjectStoreAccessArgs,
    ObjectStoreArgs,
    WarrenEdge,
    WarrenEdgeArgs,
    WarrenPlatform,
    WarrenPlatformArgs,
)
from warren_components.kubernetes_objects import Manifest

import pulumi

# The current Amazon Linux 2023 for x86_64, published by AWS as a public SSM parameter.
AL2023_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
SYSTEM_NAMESPACE = "warren-system"
EDGE_SERVICE = "warren-control"  # the rendered ClusterIP Service of the edge


def deploy(settings: StackSettings) -> None:
    # load() fills exactly the section of the stack's target.
    if settings.local is not None:
        deploy_local(settings, settings.local)
    elif settings.aws is not None:
        deploy_aws(settings, settings.aws)


def deploy_local(settings: StackSettings, local: LocalSettings) -> None:
    platform = WarrenPlatform(
        "warren",
        WarrenPlatformArgs(kubeconfig=str(local.kubeconfig), context=local.context, config=settings.warren),
    )
    pulumi.export("objects", platform.objects)


def edge_service(objects: list[Manifest]) -> Manifest:
    """The rendered Service the load balancer stands in front of."""
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == "Service" and (meta.get("namespace"), meta["name"]) == (
            SYSTEM_NAMESPACE,
            EDGE_SERVICE,
        ):
            return obj
    raise ValueError(f"warren rendered no Service {SYSTEM_NAMESPACE}/{EDGE_SERVICE}: are services enabled?")


def deploy_aws(settings: StackSettings, cfg: AwsSettings) -> None:
    name = f"warren-{settings.stack}"

    # One explicit provider: the region comes from stack settings, and every resource is tagged.
    provider = aws.Provider(
        "aws",
        region=cfg.region,
        default_tags=aws.ProviderDefaultTagsArgs(
            tags={"app.kubernetes.io/part-of": "warren", "warren.dev/stack": settings.stack}
        ),
    )
    on_aws = pulumi.ResourceOptions(providers={"aws": provider})

    cluster = AwsSandboxCluster(
        name,
        AwsSandboxClusterArgs(
            cluster_name=name,
            region=cfg.region,
            availability_zones=cfg.availability_zones,
            gvisor=cfg.gvisor,
            vpc_cidr=cfg.vpc_cidr,
            kubernetes_version=cfg.kubernetes_version,
            endpoint_public_access=cfg.endpoint_public_access,
            public_access_cidrs=cfg.public_access_cidrs,
            nat_gateway_per_zone=cfg.nat_gateway_per_zone,
            node_instance_types=cfg.node_instance_types,
            node_min_size=cfg.node_min_size,
            node_desired_size=cfg.node_desired_size,
            node_max_size=cfg.node_max_size,
            node_disk_gib=cfg.node_disk_gib,
            node_capacity_type=cfg.node_capacity_type,
            # The RuntimeClass handler warren renders, so nodes register the same name.
            runtime_handler=settings.warren.isolation.runtime_handler,
            containerd_config_version=cfg.containerd_config_version,
            log_retention_days=cfg.log_retention_days,
        ),
        opts=on_aws,
    )

    store = ObjectStore(
        f"{name}-workspaces",
        ObjectStoreArgs(
            bucket_name=cfg.bucket_name,
            encryption=cfg.bucket_encryption,
            noncurrent_version_days=cfg.noncurrent_version_days,
        ),
        opts=on_aws,
    )

    database = Database(
        f"{name}-records",
        DatabaseArgs(
            vpc_id=cluster.vpc_id,
            subnet_ids=cluster.private_subnet_ids,
            client_security_group_ids=[cluster.node_security_group_id],
            deletion_protection=cfg.database_deletion_protection,
            engine_version=cfg.database_engine_version,
            instance_class=cfg.database_instance_class,
            allocated_storage_gib=cfg.database_storage_gib,
            max_allocated_storage_gib=cfg.database_storage_gib * 4,
            backup_retention_days=cfg.database_backup_retention_days,
            multi_az=cfg.database_multi_az,
        ),
        opts=on_aws,
    )

    ami_id: pulumi.Input[str] = (
        cfg.kvm_ami_id
        or aws.ssm.get_parameter_output(
            name=AL2023_AMI_PARAMETER, opts=pulumi.InvokeOutputOptions(provider=provider)
        ).value
    )
    kvm = KvmHostPool(
        f"{name}-kvm",
        KvmHostPoolArgs(
            vpc_id=cluster.vpc_id,
            subnet_ids=cluster.private_subnet_ids,
            ami_id=ami_id,
            instance_type=cfg.kvm_instance_type,
            min_size=cfg.kvm_host_count,
            desired_size=cfg.kvm_host_count,
            max_size=cfg.kvm_host_count,
            ingress=[
                IngressFrom(cluster.node_security_group_id, port, f"forkd port {port} from sandbox nodes")
                for port in cfg.kvm_ingress_ports
            ],
        ),
        opts=on_aws,
    )

    # warren-blockd and the control plane reach the bucket as themselves: no key anywhere.
    access = ObjectStoreAccess(
        f"{name}-workspaces-access",
        ObjectStoreAccessArgs(
            cluster_name=cluster.cluster_name,
            bucket_arn=store.bucket_arn,
            kms_key_arn=store.kms_key_arn,
            namespace=SYSTEM_NAMESPACE,
        ),
        opts=on_aws,
    )

    platform = WarrenPlatform(
        name,
        WarrenPlatformArgs(
            kubeconfig=cluster.kubeconfig,
            config=settings.warren,
            # A generated bucket's name exists once the bucket does.
            deploy_time={} if cfg.bucket_name else {"services.bucket": store.bucket_name},
            # The install Job finds the database the stack made (the URL a secret throughout).
            secrets={"warren-database": {"url": database.connection_url}},
            # After the whole cluster (node group, VPC CNI and Pod Identity add-ons): the egress
            # floor's NetworkPolicy is enforced from the moment it exists, and Warren's pods
            # get their identity from their first start.
            depends_on=[cluster, access],
        ),
        opts=pulumi.ResourceOptions(depends_on=[cluster, access]),
    )

    edge = WarrenEdge(
        f"{name}-edge",
        WarrenEdgeArgs(
            edge_service=edge_service(platform.manifests),
            allowed_cidrs=cfg.edge.allowed_cidrs,
            internet_facing=cfg.edge.internet_facing,
            certificate_arn=cfg.edge.certificate_arn,
            hostname=cfg.edge.hostname,
        ),
        # Once the control plane is rolled out: the load balancer's first health checks pass.
        opts=pulumi.ResourceOptions(providers={"kubernetes": platform.provider}, depends_on=[platform]),
    )

    pulumi.export("clusterName", cluster.cluster_name)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("bucketName", store.bucket_name)
    pulumi.export("databaseAddress", database.address)
    pulumi.export("databaseSecretArn", database.master_user_secret_arn)
    pulumi.export("kvmAutoscalingGroup", kvm.autoscaling_group_name)
    pulumi.export("objects", platform.objects)
    pulumi.export("apiUrl", edge.url)
    pulumi.export("apiLoadBalancer", edge.hostname)
