"""cluster.yaml is a valid Ray autoscaler config (checked offline; no cloud provider is contacted)."""

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config  # internal API: Ray is pinned

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_is_valid():
    config = prepare_config(yaml.safe_load((ROOT / "cluster.yaml").read_text()))
    validate_config(config)
    assert config["head_node_type"] in config["available_node_types"]
    commands = " ".join(config["head_start_ray_commands"])
    assert "mlflow server" in commands and "--backend-store-uri" in commands
    assert "0.0.0.0" not in commands, "servers listen on a private address, never on every interface"
