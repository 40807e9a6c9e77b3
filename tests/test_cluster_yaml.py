"""Tests for cluster.yaml, the Ray cluster-launcher config for AWS.

Everything here runs offline: `prepare_config` merges the file with Ray's AWS defaults.yaml (a local
file) and `validate_config` checks the result against Ray's JSON schema and its cross-field rules, the
two steps `ray up` takes before its first cloud call. The AWS-side steps (resource autodetection,
IAM, subnets, security groups, launching) need boto3 and credentials and are not run; the security
group Ray would create is rebuilt from Ray's own rule functions, read from its source.
"""

from __future__ import annotations

import ast
import copy
import functools
import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
CONNECT_FILE = ROOT / "raytrain_seq" / "runtime" / "connect.py"
RAY_AUTOSCALER = Path(ray.autoscaler.__file__).parent
DASHBOARD_PORT = 8265
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


@functools.lru_cache(maxsize=1)
def _raw_text() -> str:
    return CLUSTER_YAML.read_text()


def _raw() -> dict[str, Any]:
    """cluster.yaml as written (a fresh copy each call: tests mutate it)."""
    return yaml.safe_load(_raw_text())


def _prepared(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config as `ray up` sees it after prepare_config (defaults merged, setup commands merged)."""
    return prepare_config(copy.deepcopy(_raw() if config is None else config))


def _types(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(head node type, {name: worker node type})."""
    types = config["available_node_types"]
    head = config["head_node_type"]
    return types[head], {name: t for name, t in types.items() if name != head}


def _commands(config: dict[str, Any]) -> list[str]:
    """Every shell command in the config, top level and per node type."""
    found = [cmd for key in COMMAND_LISTS for cmd in config.get(key, [])]
    for node_type in config["available_node_types"].values():
        found += node_type.get("initialization_commands", []) + node_type.get("worker_setup_commands", [])
    return found


def _ray_starts(config: dict[str, Any]) -> list[str]:
    return [cmd for cmd in _commands(config) if "ray start" in cmd]


def _flag(cmd: str, name: str) -> str | None:
    """Value of `--name=V` or `--name V` in a command (`--num-cpus=6` -> "6"); None when absent."""
    match = re.search(rf"{re.escape(name)}(?:=|\s+)(\S+)", cmd)
    return None if match is None else match.group(1)


def _dashboard_exposures(config: dict[str, Any]) -> list[str]:
    """Start commands that would put the dashboard anywhere but the head's loopback interface."""
    bad = []
    for cmd in _ray_starts(config):
        host = _flag(cmd, "--dashboard-host")
        if "--head" in cmd and host != "127.0.0.1":
            bad.append(cmd)  # absent or another address: only an explicit 127.0.0.1 counts
        elif host not in (None, "127.0.0.1"):
            bad.append(cmd)
    return bad


def _token_auth_missing(config: dict[str, Any]) -> list[str]:
    """`ray start` commands that do not export RAY_AUTH_MODE=token before starting Ray."""
    missing = []
    for cmd in _ray_starts(config):
        before = cmd[: cmd.index("ray start")]
        if not re.search(r"\bexport\b[^;&|]*\bRAY_AUTH_MODE=token(\s|;|$)", before):
            missing.append(cmd)
    return missing


def _walk(node: Any) -> Iterator[Any]:
    """Every value in a parsed YAML document, depth first, the containers themselves included."""
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def _port_rules(document: Any) -> list[dict[str, Any]]:
    """Every mapping anywhere in the document that names a port range (an EC2 IpPermission)."""
    return [n for n in _walk(document) if isinstance(n, dict) and ({"FromPort", "ToPort"} & n.keys())]


def _covers(rule: dict[str, Any], port: int) -> bool:
    """Whether an EC2 IpPermission admits `port`: protocol "-1" or port -1 means every port."""
    low, high = rule.get("FromPort", -1), rule.get("ToPort", -1)
    return str(rule.get("IpProtocol")) == "-1" or low == -1 or low <= port <= high


def _from_outside(rule: dict[str, Any]) -> bool:
    """Whether an IpPermission admits addresses (IPv4/IPv6 ranges, prefix lists), not only cluster groups."""
    return any(rule.get(key) for key in ("IpRanges", "Ipv6Ranges", "PrefixListIds"))


@functools.lru_cache(maxsize=1)
def _ray_default_rule_functions() -> dict[str, Any]:
    """Ray's own `_create_default_*_inbound_rules` from ray/autoscaler/_private/aws/config.py.

    That module imports boto3 at the top (not installed here, and not needed by these pure
    functions), so only the three function definitions are compiled from its source.
    """
    source = (RAY_AUTOSCALER / "_private" / "aws" / "config.py").read_text()
    wanted = {
        "_create_default_inbound_rules",
        "_create_default_intracluster_inbound_rules",
        "_create_default_ssh_inbound_rules",
    }
    defs = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {d.name for d in defs} == wanted, "Ray's default security-group rule functions moved"
    namespace: dict[str, Any] = {"itertools": itertools}
    exec(compile(ast.Module(body=defs, type_ignores=[]), "ray_aws_config", "exec"), namespace)
    return namespace


def _rules_ray_up_authorizes(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The inbound rules `ray up` puts on the security group it creates for this config."""
    extended = config["provider"].get("security_group", {}).get("IpPermissions", [])
    sgids = {"sg-cluster"}
    return _ray_default_rule_functions()["_create_default_inbound_rules"](sgids, copy.deepcopy(extended))


def _dashboard_openings(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Rules, written in the file or authorized by `ray up`, that let an outside address reach 8265."""
    rules = _port_rules(config) + _rules_ray_up_authorizes(config)
    return [r for r in rules if _from_outside(r) and _covers(r, DASHBOARD_PORT)]


def _worker_reuse() -> dict[str, int]:
    """WORKER_REUSE, PREALLOCATE and DEATH_AT_ONCE from raytrain_seq/runtime/connect.py, read from its
    source (importing it loads torch), as the RAY_* environment spells them (Ray reads a true flag as 1)."""
    found = {}
    for node in ast.parse(CONNECT_FILE.read_text()).body:
        names = {getattr(t, "id", "") for t in getattr(node, "targets", ())}
        if isinstance(node, ast.Assign) and names & {"WORKER_REUSE", "PREALLOCATE", "DEATH_AT_ONCE"}:
            found.update(ast.literal_eval(node.value))
    wanted = {
        "idle_worker_killing_time_threshold_ms",
        "preallocate_plasma_memory",
        "timeout_ms_task_wait_for_death_info",
    }
    if not wanted <= set(found):
        raise AssertionError(f"no WORKER_REUSE, PREALLOCATE or DEATH_AT_ONCE in {CONNECT_FILE}")
    return {name: int(value) if isinstance(value, bool) else value for name, value in found.items()}


def test_cluster_yaml_passes_rays_validator():
    """cluster.yaml, prepared as `ray up` prepares it, passes ray.autoscaler's validate_config."""
    config = _prepared()
    validate_config(config)
    # prepare_config really merged Ray's AWS defaults (a key this file leaves out) and kept ours.
    assert "docker" not in _raw() and config["docker"] == {}
    assert config["head_start_ray_commands"] == _raw()["head_start_ray_commands"]
    assert config["available_node_types"] == _raw()["available_node_types"]


def _gpu_type(config: dict[str, Any]) -> dict[str, Any]:
    return config["available_node_types"]["ray.worker.gpu"]


# (what breaks, how, what validate_config raises): each is a mistake a user editing the file could make.
BROKEN_COPIES = [
    ("GPU type without resources", lambda c: _gpu_type(c).pop("resources"), jsonschema.ValidationError),
    ("fractional GPU count", lambda c: _gpu_type(c)["resources"].update(GPU=0.5), jsonschema.ValidationError),
    ("misspelt top-level key", lambda c: c.update(idle_timeout_minute=5), jsonschema.ValidationError),
    ("head type not defined", lambda c: c.update(head_node_type="ray.head.missing"), ValueError),
    ("global max below the sum of min_workers", lambda c: c.update(max_workers=1), ValueError),
]


@pytest.mark.parametrize(("what", "breakage", "error"), BROKEN_COPIES, ids=[b[0] for b in BROKEN_COPIES])
def test_validator_rejects_broken_copies(what, breakage, error):
    """Ray's validator is not a rubber stamp: each broken copy of cluster.yaml is rejected."""
    config = _prepared()
    validate_config(copy.deepcopy(config))  # the unbroken copy passes: the breakage is what fails
    breakage(config)
    with pytest.raises(error):
        validate_config(config)


def test_head_is_cpu_only_and_gpu_workers_span_the_learner_range():
    """Head: GPU 0, CPU = its --num-cpus; one GPU type, GPU >= 1, min..max workers = --learners MIN:MAX."""
    config = _prepared()
    head, workers = _types(config)
    assert head["resources"]["GPU"] == 0 and head["resources"]["CPU"] >= 1
    assert head["min_workers"] == head["max_workers"] == 0
    (head_start,) = [cmd for cmd in _ray_starts(config) if "--head" in cmd]
    assert int(_flag(head_start, "--num-cpus")) == head["resources"]["CPU"]
    assert _flag(head_start, "--num-gpus") in (None, "0")

    gpus = {name: t for name, t in workers.items() if t["resources"]["GPU"] >= 1}
    assert len(gpus) == 1, f"one GPU worker type expected, found {sorted(gpus)}"
    (gpu,) = gpus.values()
    # The feed's CPU workers: none at rest, added by the autoscaler, never a GPU.
    cpus_only = [t for t in workers.values() if t["resources"]["GPU"] == 0]
    assert all(t["min_workers"] == 0 and t["max_workers"] >= 1 for t in cpus_only)
    assert config["max_workers"] == sum(t["max_workers"] for t in workers.values())
    low, high = gpu["min_workers"], gpu["max_workers"]
    assert gpu["resources"]["GPU"] >= 1 and gpu["resources"]["CPU"] >= 1  # a learner holds 1 GPU + 1 CPU
    assert 1 <= low <= high <= config["max_workers"]
    assert (low, high) == (2, 8)
    # The command the file tells users to run asks for exactly this learner range.
    learners = re.findall(r"--learners (\d+):(\d+)", _raw_text())
    assert learners and {(int(a), int(b)) for a, b in learners} == {(low, high)}
    # Every learner count in the range leaves a CPU for the data tasks (the job refuses to start
    # otherwise: learners + 1 CPUs at least), counting one learner per GPU node.
    for nodes in (low, high):
        cpus = head["resources"]["CPU"] + nodes * gpu["resources"]["CPU"]
        assert cpus >= nodes * gpu["resources"]["GPU"] + 1
    # Resources are explicit for every type, so Ray's AWS autodetection (a cloud call) never sets them.
    for node_type in config["available_node_types"].values():
        assert {"CPU", "GPU"} <= node_type["resources"].keys()
    # One AMI for all types: every node of a Ray cluster must run the same Python.
    assert len({t["node_config"]["ImageId"] for t in config["available_node_types"].values()}) == 1


def test_dashboard_stays_on_localhost():
    """The head's ray start binds the dashboard to 127.0.0.1 explicitly; no ray start binds it elsewhere."""
    config = _prepared()
    assert _dashboard_exposures(config) == []
    (head_start,) = [cmd for cmd in _ray_starts(config) if "--head" in cmd]
    assert _flag(head_start, "--dashboard-host") == "127.0.0.1"
    assert _flag(head_start, "--dashboard-port") in (None, str(DASHBOARD_PORT))  # where `ray dashboard` looks

    # Not vacuous: the launcher's own default head command binds 0.0.0.0, and a copy of cluster.yaml
    # without its head_start_ray_commands inherits it; the check catches both.
    defaults = yaml.safe_load((RAY_AUTOSCALER / "aws" / "defaults.yaml").read_text())
    assert _dashboard_exposures(defaults)
    bare = _raw()
    del bare["head_start_ray_commands"]
    assert _dashboard_exposures(_prepared(bare))


def test_port_8265_is_never_opened():
    """Neither the file nor the security group `ray up` creates for it admits outside traffic to 8265."""
    config = _prepared()
    assert [r for r in _port_rules(config) if _covers(r, DASHBOARD_PORT)] == []
    assert _dashboard_openings(config) == []
    # 8265 appears only as the dashboard port of a localhost-bound head: nothing publishes it
    # (no docker -p, no tunnel, no other listener).
    mentions = [v for v in _walk(config) if isinstance(v, (str, int)) and str(DASHBOARD_PORT) in str(v)]
    assert all(isinstance(v, str) and v in _ray_starts(config) for v in mentions)
    assert _dashboard_exposures(config) == []

    # What `ray up` authorizes: all ports from the cluster's own groups, and SSH from anywhere.
    rules = _rules_ray_up_authorizes(config)
    outside = [r for r in rules if _from_outside(r)]
    assert [(r["FromPort"], r["ToPort"]) for r in outside] == [(22, 22)]  # the check sees public rules
    intracluster = [r for r in rules if not _from_outside(r)]
    assert intracluster and all(r["UserIdGroupPairs"] and _covers(r, DASHBOARD_PORT) for r in intracluster)

    # Not vacuous: an extra rule for a range holding 8265, or for all traffic, is caught,
    # although Ray's validator accepts both.
    for extra in (
        {"FromPort": 8000, "ToPort": 9000, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"FromPort": -1, "ToPort": -1, "IpProtocol": "-1", "Ipv6Ranges": [{"CidrIpv6": "::/0"}]},
    ):
        opened = _raw()
        opened["provider"]["security_group"] = {"IpPermissions": [extra]}
        opened = _prepared(opened)
        validate_config(opened)
        assert _dashboard_openings(opened) == [extra, extra]  # found in the file and in the group


def test_token_auth_on_in_every_ray_start():
    """Every `ray start` exports RAY_AUTH_MODE=token; file_mounts ships ~/.ray/auth_token to every node."""
    config = _prepared()
    starts = _ray_starts(config)
    assert {"--head" in cmd for cmd in starts} == {True, False}  # head and workers both checked
    assert _token_auth_missing(config) == []
    # Ray's token loader reads ~/.ray/auth_token on each node; the launcher copies file_mounts to the
    # head and from the head to each worker, at the same path.
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    # The token itself is never written into the file (it would travel with the repository).
    assert not [v for v in _walk(config) if isinstance(v, str) and "RAY_AUTH_TOKEN" in v]
    # The same commands keep idle workers as long as the job's own local cluster does.
    for name, value in _worker_reuse().items():
        for cmd in starts:
            assert re.search(rf"\bRAY_{name}={value}\b", cmd[: cmd.index("ray start")]), cmd

    # Not vacuous: Ray's default start commands, and a copy that sets the mode to disabled, fail.
    defaults = yaml.safe_load((RAY_AUTOSCALER / "aws" / "defaults.yaml").read_text())
    assert _token_auth_missing(defaults)
    disabled = _raw()
    disabled["worker_start_ray_commands"] = [
        cmd.replace("RAY_AUTH_MODE=token", "RAY_AUTH_MODE=disabled")
        for cmd in disabled["worker_start_ray_commands"]
    ]
    assert len(_token_auth_missing(_prepared(disabled))) == 1


def test_setup_commands_install_the_project():
    """Head and workers install torch, then this project (pip install -e) from the repo file_mounts copies."""
    raw, config = _raw(), _prepared()
    (repo_on_node,) = [remote for remote, local in raw["file_mounts"].items() if local == "."]
    install = f"pip install -e {repo_on_node}"
    assert any(install in cmd for cmd in raw["setup_commands"])
    # prepare_config prepends setup_commands to each node kind's own list: check what each node runs.
    for key in ("head_setup_commands", "worker_setup_commands"):
        commands = config[key]
        at = [i for i, cmd in enumerate(commands) if install in cmd]
        torch = [i for i, cmd in enumerate(commands) if re.search(r"pip install \S*torch==", cmd)]
        assert at and torch and max(torch) < min(at), f"{key}: torch must be installed before the project"
    # The head's autoscaler launches EC2 workers through boto3, which ray[default] does not bring.
    assert any("boto3" in cmd for cmd in config["head_setup_commands"])
    # The local virtualenv (GBs) never travels with the repository copy.
    assert ".venv" in config["rsync_exclude"]
    # Every command is valid bash (the launcher runs each in `bash --login -c -i`).
    for cmd in _commands(config):
        result = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
        assert result.returncode == 0, f"{cmd!r}: {result.stderr}"
    # Not vacuous: bash -n does reject a broken command.
    assert subprocess.run(["bash", "-n", "-c", "if true; then"], capture_output=True).returncode != 0


def test_idle_timeout_is_set():
    """idle_timeout_minutes is set in cluster.yaml itself (not left to Ray's default) and positive."""
    raw = _raw()
    assert "idle_timeout_minutes" in raw
    assert isinstance(raw["idle_timeout_minutes"], (int, float)) and raw["idle_timeout_minutes"] > 0
    assert _prepared()["idle_timeout_minutes"] == raw["idle_timeout_minutes"]


def test_run_folder_is_on_storage_every_node_mounts():
    """The job's --storage-path is mounted by a setup command that the head and every worker run."""
    config = _prepared()
    (path,) = set(re.findall(r"--storage-path (/[\w/.-]+)", _raw_text()))
    mounts = re.compile(rf"\bmount\b[^;&|]*\s{re.escape(path)}(\s|$)")
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert any(mounts.search(cmd) for cmd in config[key]), f"{key} never mounts {path}"
    # Not vacuous: Ray's default commands mount nothing there.
    defaults = prepare_config(yaml.safe_load((RAY_AUTOSCALER / "aws" / "defaults.yaml").read_text()))
    assert not any(mounts.search(cmd) for cmd in _commands(defaults))
