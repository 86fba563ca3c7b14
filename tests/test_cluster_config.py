"""cluster.yaml is a valid Ray autoscaler config (checked offline; no cloud provider is contacted), and
holds nothing a user must find out by failure: no placeholder image, GPU workers of two sizes, servers
on private addresses only, and a sweep command that waits for the GPUs it sizes itself to."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config  # internal API: Ray is pinned

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
# AWS's public SSM parameters for its Deep Learning AMIs; EC2 resolves `resolve:ssm:<name>` at launch.
DLAMI_PARAMETER = re.compile(r"^resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                             r"base-oss-nvidia-driver-gpu-ubuntu-2[2-9]\.04/latest/ami-id$")
PRIVATE_ADDRESS = "$(hostname -I | cut -d' ' -f1)"   # the head's first (private) address


def ray_default_amis() -> dict[str, str]:
    """Ray's AWS provider's DEFAULT_AMI table (region -> the id it uses when ImageId is absent), read
    from its source: importing that module needs boto3, which only the machine running `ray up` has."""
    source = Path(importlib.util.find_spec("ray.autoscaler._private.aws.config").origin).read_text()
    [table] = [node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "DEFAULT_AMI" for t in node.targets)]
    return ast.literal_eval(table)


@pytest.fixture(scope="module")
def config():
    config = prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))
    validate_config(config)
    return config


def _gpu_workers(config) -> dict:
    return {name: t for name, t in config["available_node_types"].items()
            if name != config["head_node_type"]}


def _mlflow_server_command(config) -> str:
    [command] = [c for c in config["head_start_ray_commands"] if "mlflow server" in c]
    return command


def test_cluster_yaml_is_valid(config):
    assert config["head_node_type"] in config["available_node_types"]
    command = _mlflow_server_command(config)
    assert "--backend-store-uri" in command and "--artifacts-destination" in command


def test_no_placeholder_image():
    text = CLUSTER_YAML.read_text()
    for ami in re.findall(r"ami-[0-9a-f]+", text):
        digits = ami.removeprefix("ami-")
        assert not re.search(r"(.)\1{5}|(..)\2{3}", digits), f"{ami} looks like a placeholder"
    assert "ami-0a0a" not in text and "ami-xxx" not in text.lower()


def test_every_image_is_resolvable(config):
    """Each node's ImageId is AWS's Deep Learning AMI parameter, or an id from Ray's default table for
    the region, or absent (then Ray fills in that table's id)."""
    region, default_ami = config["provider"]["region"], ray_default_amis()
    assert default_ami.get("us-east-1", "").startswith("ami-"), "Ray's table moved: update ray_default_amis"
    for name, node_type in config["available_node_types"].items():
        image = node_type["node_config"].get("ImageId")
        assert image is None or DLAMI_PARAMETER.match(image) or image == default_ami.get(region), \
            f"node type {name}: ImageId {image!r} resolves nowhere"
        if image is None:
            assert region in default_ami, f"Ray has no default AMI for {region}"


def test_a_small_and_a_large_gpu_on_spot_and_an_on_demand_head(config):
    workers = _gpu_workers(config)
    types = {t["node_config"]["InstanceType"] for t in workers.values()}
    assert len(workers) == 2 and len(types) == 2, types
    assert any(t.startswith("g5.") for t in types)
    assert any(t.startswith(("g6e.", "p4d.", "p4de.", "p5.")) for t in types)
    for name, t in workers.items():
        assert t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot", name
        assert t["resources"] == {}, f"{name}: Ray detects the GPU itself"
    head = config["available_node_types"][config["head_node_type"]]
    assert "InstanceMarketOptions" not in head["node_config"], "the head holds the store: on-demand"
    assert head["resources"] == {"CPU": 0}, "trials must never be scheduled on the head"


def test_gpu_pools_are_fixed_and_fit_the_cluster(config):
    """The sweep sizes itself to the GPUs present when it starts: a pool that scales from zero would
    leave it planning for none (CPU trials on GPU machines)."""
    workers = _gpu_workers(config)
    active = {n: t for n, t in workers.items() if t["max_workers"] > 0}
    assert len(active) == 1, f"one kind of GPU per sweep, got {sorted(active)}"
    [pool] = active.values()
    assert pool["min_workers"] == pool["max_workers"]
    assert sum(t["min_workers"] for t in workers.values()) <= config["max_workers"]
    readme = (ROOT / "README.md").read_text()
    assert f"--wait-for-gpus {pool['max_workers']}" in readme


def test_servers_listen_on_private_addresses_only(config):
    text = CLUSTER_YAML.read_text()
    assert "0.0.0.0" not in text and "[::]" not in text, "no server may listen on every interface"
    command = _mlflow_server_command(config)
    hosts = re.findall(r"--host (.+?) --", command)
    binds = re.findall(r"--bind (\S+?):\d+", command)
    assert hosts == [PRIVATE_ADDRESS], hosts
    assert binds == ["127.0.0.1"], binds
    starts = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert "--dashboard-host" not in starts and "--node-ip-address" not in starts


def test_ray_runs_from_the_project_venv(config):
    """Nothing on the image has Ray: a bare `ray stop` would fail `ray up`; boto3 (which the autoscaler
    launches workers with) must be in the same venv, not wherever the system's pip puts it."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for command in config[key]:
            assert not re.search(r"(^|[;&|]\s*)ray ", command), f"{key}: {command!r}"
    assert any(".venv/bin/pip install" in c and "boto3" in c for c in config["head_setup_commands"])
    for command in config["head_setup_commands"]:
        assert not re.search(r"(^|&&\s*)pip install", command), f"system pip: {command!r}"


def test_no_secret_in_the_file():
    text = CLUSTER_YAML.read_text()
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)
    assert not re.search(r"(HF_TOKEN|AWS_SECRET_ACCESS_KEY|PASSWORD)\s*[=:]", text)


def test_readme_runs_the_cluster_end_to_end():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## On a cluster"):]
    section = section[:section.index("\n## ", 1)]
    for step in ("ray up cluster.yaml", "sweeps/full.py", "--address auto", "-p 5000 -p 8050",
                 "dashboard/app.py", "ray rsync-down cluster.yaml", "ray down cluster.yaml"):
        assert step in section, step
    assert section.index("ray rsync-down") < section.index("ray down cluster.yaml"), "copy the store first"


def test_hf_token_and_plugins_reach_the_trials_through_ray_only(monkeypatch):
    from sweeps import launch

    monkeypatch.setenv("HF_TOKEN", "hf_from_the_shell")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-forwarded")
    monkeypatch.setenv("LLM_SWEEPS_ENGINES", "my_engine")
    monkeypatch.setenv("LLM_SWEEPS_TECHNIQUES", "my_technique")
    assert launch.worker_env_vars() == {"HF_TOKEN": "hf_from_the_shell", "LLM_SWEEPS_ENGINES": "my_engine",
                                      "LLM_SWEEPS_TECHNIQUES": "my_technique"}
    for name in ("HF_TOKEN", "LLM_SWEEPS_ENGINES", "LLM_SWEEPS_TECHNIQUES"):
        monkeypatch.delenv(name)
    assert launch.worker_env_vars() == {}


def test_wait_for_gpus_needs_a_cluster():
    from sweeps import full
    from trials.errors import ConfigError

    with pytest.raises(ConfigError, match="--wait-for-gpus needs --address"):
        full.validate(full.parse_args(["--wait-for-gpus", "2", "--groups", "baseline"]))
    full.validate(full.parse_args(["--wait-for-gpus", "2", "--address", "auto", "--groups", "baseline"]))
