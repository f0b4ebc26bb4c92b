"""The integration tests of ``tests.unit.runtime.test_node_types``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

from arrayjob.runtime.node_types import (
    NodeType,
    read_node_types,
)
from tests.unit.runtime.test_node_types import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    FAKE,
    REPO,
    SMALL,
)


def test_the_cluster_config_ray_keeps_in_the_gcs(ray_session):
    """What an autoscaler that reports its config leaves in a real GCS (as Ray's own
    test_state_api does: ``GcsClient.report_cluster_config``), read by address."""
    import ray
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    config = autoscaler_pb2.ClusterConfig()
    for name, cpus, store, count in (("head", 0, 0, 1), ("m5.large", 2, 3 * 10**9, -1), ("small", 1, 10**8, 4)):
        group = config.node_group_configs.add()
        group.name, group.max_count = name, count
        group.resources["CPU"] = cpus
        if store:
            group.resources["object_store_memory"] = store
    address = ray.get_runtime_context().gcs_address
    client = GcsClient(address=address)
    client.report_cluster_config(config.SerializeToString())
    try:
        found = read_node_types(address)
    finally:
        client.report_cluster_config(autoscaler_pb2.ClusterConfig().SerializeToString())
    assert found.types == (NodeType("m5.large", 2.0, None, 3 * 10**9, None), NodeType("small", 1.0, None, 10**8, 4))
    assert found.source == "the cluster's autoscaler config in the GCS"
    assert read_node_types(address).types == ()  # an empty config: no types, the price table as before
