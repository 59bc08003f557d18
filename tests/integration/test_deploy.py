"""deploy/ is checked against the code, not just parsed.

* Kubernetes manifests: the YAML parses; the ConfigMap's user_config.json is accepted by
  every component (`motor node-manager --check-config` per role, `motor controller
  --check-config`, `motor coordinator --check-config`); every port a container declares, a
  Service forwards or a probe asks is the one the configuration gives that component;
  probe paths are routes of that component; env names are ones the code reads; the
  downward API feeds POD_IP / JOB_NAME / ROLE; commands and flags exist; Service
  selectors match pods; one Job per instance.
* systemd units: parse; ExecStart names a real subcommand and real flags; the env files
  set names the code reads.
* Every examples/*.json plans (`motor up --dry-run`) and passes the node manager's, the
  controller's and the coordinator's own checks."""

from __future__ import annotations

import configparser
import functools
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml  # python3-yaml (scripts/deps.sh)

import motorlib
from motorlib import REPO

K8S = REPO / "deploy" / "kubernetes"
SYSTEMD = REPO / "deploy" / "systemd"
SRC = REPO / "src"
NAMESPACE = "mindie-motor"
ROLES = ["prefill", "decode", "union", "encode"]
INSTANCES_KEY = {"prefill": "p", "decode": "d", "union": "hybrid", "encode": "e"}
NPU_KEY = {"prefill": "p_pod_npu_num", "decode": "d_pod_npu_num",
           "union": "hybrid_pod_npu_num", "encode": "e_pod_npu_num"}


def motor(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([motorlib.motor_bin(), *[str(a) for a in args]], capture_output=True,
                          text=True, env=full, timeout=timeout)


@functools.lru_cache(maxsize=None)
def docs() -> tuple:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d is not None:
                out.append((path.name, d))
    return tuple(out)


def of_kind(kind: str) -> list[dict]:
    return [d for _, d in docs() if d.get("kind") == kind]


def named(kind: str, name: str) -> dict:
    found = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def user_config() -> dict:
    cm = named("ConfigMap", "motor-user-config")
    return json.loads(cm["data"]["user_config.json"])


def write_user_config(tmpdir: str, cfg: dict) -> str:
    path = os.path.join(tmpdir, "user_config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict) -> dict:
    cs = pod_spec(workload)["containers"]
    assert len(cs) == 1, "one container per Motor pod"
    return cs[0]


def port_map(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


@functools.lru_cache(maxsize=None)
def sources(sub: str) -> str:
    text = []
    for p in sorted((SRC / sub).rglob("*.[ch]")):
        text.append(p.read_text(errors="replace"))
    return "\n".join(text)


def probes(c: dict) -> list[dict]:
    return [c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
            if k in c and "httpGet" in c[k]]


def resolve_port(c: dict, port) -> int:
    return port_map(c)[port] if isinstance(port, str) else int(port)


def check_command(cmd: list[str]) -> None:
    """`motor <sub> --flags ...`: the subcommand exists and takes those flags."""
    assert cmd[0].endswith("motor"), cmd
    sub = cmd[1]
    helptext = motor("help").stdout
    assert re.search(rf"^\s+{re.escape(sub)}\s", helptext, re.M), f"no subcommand {sub}"
    usage = motor(sub, "--help")
    assert usage.returncode == 0, usage
    for arg in cmd[2:]:
        if arg.startswith("-"):
            flag = arg.split("=", 1)[0]
            assert re.search(rf"(^|\s){re.escape(flag)}(\s|,|$)", usage.stdout, re.M), \
                f"motor {sub} has no flag {flag}"


def assert_env_known(name: str) -> None:
    assert f'"{name}"' in sources(""), f"env {name} is read nowhere in src/"


# ---------------------------------------------------------------------------------------


def test_manifests_parse_and_are_complete():
    assert docs(), "no manifests"
    kinds = {d["kind"] for _, d in docs()}
    assert {"Namespace", "ConfigMap", "Deployment", "Service", "Job", "StatefulSet"} <= kinds
    for fname, d in docs():
        assert d.get("apiVersion") and d.get("kind"), fname
        if d["kind"] == "Kustomization":
            for r in d["resources"]:
                assert (K8S / r).is_file(), r
            continue
        assert d["metadata"].get("name"), fname
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, (fname, d["metadata"])


def test_configmap_is_accepted_by_every_component(tmpdir_path):
    cfg = user_config()
    path = write_user_config(tmpdir_path, cfg)
    roles = [r for r in ROLES if f"motor_engine_{r}_config" in cfg]
    assert roles
    for role in roles:
        r = motor("node-manager", "--check-config", "--config", path,
                  env={"ROLE": role, "POD_IP": "10.1.2.3", "JOB_NAME": f"j-{role}",
                       "POD_NAMESPACE": NAMESPACE})
        assert r.returncode == 0, r.stderr
        eff = json.loads(r.stdout)
        assert eff["controller"]  # the node manager found the controller's address
    r = motor("controller", "--check-config", "--config", path, env={"POD_IP": "127.0.0.1"})
    assert r.returncode == 0, r.stdout + r.stderr
    r = motor("coordinator", "--check-config", "--config", path, env={"POD_IP": "10.1.2.3"})
    assert r.returncode == 0, r.stderr
    eff = json.loads(r.stdout)
    oapi = cfg["motor_coordinator_config"]["api_config"]
    assert eff["api_config"]["coordinator_api_host"] == \
        oapi.get("coordinator_api_host", "10.1.2.3")
    assert eff["api_config"]["coordinator_api_infer_port"] == oapi["coordinator_api_infer_port"]
    assert eff["api_config"]["coordinator_api_mgmt_port"] == oapi["coordinator_api_mgmt_port"]


def test_inference_jobs_match_the_configuration(tmpdir_path):
    cfg = user_config()
    path = write_user_config(tmpdir_path, cfg)
    deploy = cfg["motor_deploy_config"]
    jobs = of_kind("Job")
    for role in [r for r in ROLES if f"motor_engine_{r}_config" in cfg]:
        k = INSTANCES_KEY[role]
        mine = [j for j in jobs if env_of(container(j))["ROLE"].get("value") == role]
        assert len(mine) == deploy.get(f"{k}_instances_num", 1), (role, len(mine))
        r = motor("node-manager", "--check-config", "--config", path,
                  env={"ROLE": role, "POD_IP": "10.1.2.3", "JOB_NAME": "j"})
        eff = json.loads(r.stdout)
        nm_port = eff["api_config"]["node_manager_port"]
        engine_ports = [int(p) for p in eff["endpoint_config"]["service_ports"]]
        for job in mine:
            assert job["spec"]["parallelism"] == deploy.get(f"single_{k}_instance_pod_num", 1)
            spec = pod_spec(job)
            assert spec["restartPolicy"] == "OnFailure"  # exit 255 = restart
            c = container(job)
            check_command(c["command"])
            env = env_of(c)
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.labels['job-name']"
            for name in env:
                assert_env_known(name)
            ports = port_map(c)
            assert ports["nm"] == nm_port
            assert [ports[f"engine-{i}"] for i in range(len(engine_ports))] == engine_ports
            assert len(ports) == 1 + len(engine_ports)
            paths = {p["path"]: resolve_port(c, p["port"]) for p in probes(c)}
            assert paths == {"/readiness": nm_port, "/liveness": nm_port}
            for p in paths:
                assert f'"{p}"' in sources("nodemgr"), f"node manager has no route {p}"
            # The config file is where $USER_CONFIG_PATH says, from the ConfigMap.
            cfg_path = env["USER_CONFIG_PATH"]["value"]
            check_mount(spec, c, cfg_path)
            npus = list(c["resources"]["limits"].values())
            assert npus == [deploy[NPU_KEY[role]]]


def check_mount(spec: dict, c: dict, file_path: str) -> None:
    d, f = os.path.split(file_path)
    mount = [m for m in c["volumeMounts"] if m["mountPath"] == d]
    assert mount, f"nothing mounted at {d}"
    vol = [v for v in spec["volumes"] if v["name"] == mount[0]["name"]][0]
    assert vol["configMap"]["name"] == "motor-user-config"
    assert f in named("ConfigMap", "motor-user-config")["data"]


def test_control_plane_matches_the_configuration():
    cfg = user_config()
    capi = cfg["motor_controller_config"]["api_config"]
    oapi = cfg["motor_coordinator_config"]["api_config"]

    ctl = named("Deployment", "mindie-motor-controller")
    c = container(ctl)
    check_command(c["command"])
    check_mount(pod_spec(ctl), c, c["command"][c["command"].index("--config") + 1])
    assert port_map(c)["api"] == capi["controller_api_port"]
    for p in probes(c):
        assert resolve_port(c, p["port"]) == capi["controller_api_port"]
        assert f'"{p["path"]}"' in sources("controller"), p
    for name in env_of(c):
        assert_env_known(name)
    # The SQLite file is on a mounted volume (not the read-only config).
    db_dir = os.path.dirname(cfg["motor_controller_config"]["store_config"]["sqlite_path"])
    assert any(m["mountPath"] == db_dir and not m.get("readOnly") for m in c["volumeMounts"])

    co = named("Deployment", "mindie-motor-coordinator")
    k = container(co)
    check_command(k["command"])
    assert port_map(k)["infer"] == oapi["coordinator_api_infer_port"]
    assert port_map(k)["mgmt"] == oapi["coordinator_api_mgmt_port"]
    for p in probes(k):
        assert resolve_port(k, p["port"]) == oapi["coordinator_api_mgmt_port"]
        assert f'"{p["path"]}"' in sources("coordinator"), p

    # The DNS names the components use are these Services, with these ports.
    for dns, port in ((capi["controller_api_dns"], capi["controller_api_port"]),
                      (oapi["coordinator_api_dns"], oapi["coordinator_api_mgmt_port"])):
        svc_name, ns = dns.split(".")[:2]
        assert ns == NAMESPACE
        svc = named("Service", svc_name)
        assert port in [p["port"] for p in svc["spec"]["ports"]], (svc_name, port)


def test_coordinator_master_standby(tmpdir_path):
    """Two coordinator replicas as master and standby on the etcd of etcd.yaml: the
    readiness probe is what moves the Services to the master (503 NOT_MASTER on the
    standby), and the configuration the pods get turns master/standby on."""
    co = named("Deployment", "mindie-motor-coordinator")
    assert co["spec"]["replicas"] >= 2
    k = container(co)
    ready = k["readinessProbe"]
    assert ready["httpGet"]["path"] == "/readiness"
    assert resolve_port(k, ready["httpGet"]["port"]) == \
        user_config()["motor_coordinator_config"]["api_config"]["coordinator_api_mgmt_port"]
    # a standby leaves the Services after one failed probe, a new master joins after one
    assert ready.get("failureThreshold", 3) == 1 and ready.get("successThreshold", 1) == 1
    assert ready.get("periodSeconds", 10) <= 5
    # the standby's answer is a 503 with that reason (the probe counts the status)
    assert '"NOT_MASTER"' in sources("coordinator")
    # the liveness probe must not kill a standby: /liveness stays 200 on it
    assert k["livenessProbe"]["httpGet"]["path"] == "/liveness"
    # every Service in front of the coordinators selects both replicas
    for svc in of_kind("Service"):
        if svc["spec"]["selector"] == {"app.kubernetes.io/name": "motor-coordinator"}:
            assert svc["spec"].get("clusterIP") != "None", svc["metadata"]["name"]
    # the configuration: master/standby on, etcd at the motor-etcd Service, accepted
    cfg = user_config()
    sb = cfg["motor_coordinator_config"]["standby_config"]
    assert sb["enable_master_standby"] is True
    ep = cfg["motor_coordinator_config"]["etcd_config"]["etcd_endpoints"][0]
    sts = named("StatefulSet", "motor-etcd")
    assert ep == f"http://{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local:2379"
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "etcd.yaml" in kust["resources"]
    r = motor("coordinator", "--check-config", "--config", write_user_config(tmpdir_path, cfg),
              env={"POD_IP": "127.0.0.1"})
    assert r.returncode == 0, r.stdout + r.stderr
    eff = json.loads(r.stdout)
    assert eff["standby_config"]["enable_master_standby"] is True
    assert eff["standby_config"]["master_lock_ttl"] == sb["master_lock_ttl"]
    assert eff["etcd_config"]["etcd_endpoints"] == [ep]


def test_services_select_pods_and_named_ports():
    workloads = of_kind("Deployment") + of_kind("StatefulSet") + of_kind("Job")
    for svc in of_kind("Service"):
        sel = svc["spec"]["selector"]
        targets = [w for w in workloads if
                   all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                       for k, v in sel.items())]
        assert targets, f"Service {svc['metadata']['name']} selects nothing"
        for p in svc["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            for w in targets:
                ports = port_map(container(w))
                if isinstance(tp, str):
                    assert tp in ports, (svc["metadata"]["name"], tp)
                else:
                    assert tp in ports.values(), (svc["metadata"]["name"], tp)
    for d in of_kind("Deployment") + of_kind("StatefulSet"):
        assert d["spec"]["selector"]["matchLabels"].items() <= \
            d["spec"]["template"]["metadata"]["labels"].items()


def test_etcd_store_option(tmpdir_path):
    sts = named("StatefulSet", "motor-etcd")
    svc = named("Service", sts["spec"]["serviceName"])
    client = [p for p in svc["spec"]["ports"] if p["name"] == "client"][0]
    assert client["port"] == 2379
    # The store_config the comments tell operators to use is accepted.
    cfg = user_config()
    cfg["motor_controller_config"]["store_config"] = {
        "backend": "etcd",
        "etcd_endpoints": [f"http://motor-etcd.{NAMESPACE}.svc.cluster.local:2379"]}
    r = motor("controller", "--check-config", "--config", write_user_config(tmpdir_path, cfg),
              env={"POD_IP": "127.0.0.1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["store_config"]["backend"] == "etcd", r.stdout
    assert f"motor-etcd.{NAMESPACE}.svc.cluster.local:2379" in (K8S / "controller.yaml").read_text()


def test_systemd_units():
    units = sorted(SYSTEMD.glob("*.service"))
    assert {u.name for u in units} >= {"motor-controller.service", "motor-coordinator.service",
                                       "motor-node-manager@.service", "motor-up.service"}
    for u in units:
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.optionxform = str
        cp.read_string(u.read_text())
        assert {"Unit", "Service", "Install"} <= set(cp.sections()), u.name
        svc = cp["Service"]
        argv = svc["ExecStart"].split()
        assert argv[0] == "/usr/local/bin/motor", u.name
        check_command(["motor", *argv[1:]])
        assert svc.get("Restart") in ("always", "on-failure"), u.name
        # docs/operations.md promises it of every unit (a gateway holds a descriptor per
        # connection; the distributions' default soft limit is 1024).
        assert int(svc.get("LimitNOFILE", "0")) >= 65536, u.name
        for line in u.read_text().splitlines():
            if line.startswith("Environment="):
                assert_env_known(line.split("=", 2)[1])
    for envfile in SYSTEMD.glob("*.env"):
        for line in envfile.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                assert_env_known(line.split("=", 1)[0])


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.json")))
def test_examples_are_valid(example, tmpdir_path):
    path = str(REPO / "examples" / example)
    cfg = json.loads(Path(path).read_text())
    assert cfg.get("_comment"), "every example explains itself"
    r = motor("up", "-c", path, "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["pods"]
    for role in {p["role"] for p in plan["pods"]}:
        r = motor("node-manager", "--check-config", "--config", path,
                  env={"ROLE": role, "POD_IP": "127.0.0.1", "JOB_NAME": "j", "INDEX": "0"})
        assert r.returncode == 0, (role, r.stderr)
    r = motor("controller", "--check-config", "--config", path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = motor("coordinator", "--check-config", "--config", path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)


# ---------------------------------------------------------------------------------------
# deploy/kubernetes/gang: a multi-pod instance as one scheduling unit (Volcano)

GANG = K8S / "gang" / "inference-gang.yaml"


def gang_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(GANG.read_text()) if d is not None]


def test_gang_job_schedules_and_restarts_the_instance_as_one(tmpdir_path):
    docs_ = gang_docs()
    cm = [d for d in docs_ if d["kind"] == "ConfigMap"]
    jobs = [d for d in docs_ if d["kind"] == "Job"]
    assert len(cm) == 1 and jobs
    cfg = json.loads(cm[0]["data"]["user_config.json"])
    # the same control plane as the base ConfigMap: the pods find the same controller
    base = user_config()
    for block in ("motor_controller_config", "motor_coordinator_config"):
        assert cfg[block] == base[block], block
    deploy = cfg["motor_deploy_config"]
    pods = deploy["single_d_instance_pod_num"]
    assert pods > 1, "the gang example is a multi-pod instance"
    path = write_user_config(tmpdir_path, cfg)
    for job in jobs:
        assert job["apiVersion"] == "batch.volcano.sh/v1alpha1"
        spec = job["spec"]
        assert spec["schedulerName"] == "volcano"
        replicas = sum(t["replicas"] for t in spec["tasks"])
        # all the instance's pods or none; the survivors' exit 255 restarts every pod
        assert spec["minAvailable"] == replicas == pods
        actions = {p["event"]: p["action"] for p in spec["policies"]}
        assert actions.get("PodFailed") == "RestartJob"
        assert actions.get("PodEvicted") == "RestartJob"
        for task in spec["tasks"]:
            pspec = task["template"]["spec"]
            # Never: an exit is a PodFailed event (OnFailure would restart the survivor in
            # place, alone, next to a dead peer)
            assert pspec["restartPolicy"] == "Never"
            cs = pspec["containers"]
            assert len(cs) == 1
            c = cs[0]
            check_command(c["command"])
            env = env_of(c)
            for name in env:
                assert_env_known(name)
            role = env["ROLE"]["value"]
            assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.labels['volcano.sh/job-name']"
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            # each pod registers its share of the DP ranks
            r = motor("node-manager", "--check-config", "--config", path,
                      env={"ROLE": role, "POD_IP": "10.1.2.3", "JOB_NAME": "j"})
            assert r.returncode == 0, r.stderr
            eff = json.loads(r.stdout)
            dp = cfg[f"motor_engine_{role}_config"]["engine_config"]["data_parallel_size"]
            engine_ports = [int(p) for p in eff["endpoint_config"]["service_ports"]]
            assert len(engine_ports) * pods == dp, (engine_ports, dp, pods)
            ports = port_map(c)
            assert ports["nm"] == eff["api_config"]["node_manager_port"]
            assert [ports[f"engine-{i}"] for i in range(len(engine_ports))] == engine_ports
            vols = {v["name"]: v for v in pspec["volumes"]}
            mount = [m for m in c["volumeMounts"]
                     if m["mountPath"] == os.path.dirname(env["USER_CONFIG_PATH"]["value"])][0]
            assert vols[mount["name"]]["configMap"]["name"] == cm[0]["metadata"]["name"]
            npus = list(c["resources"]["limits"].values())
            assert npus == [deploy[NPU_KEY[role]]]
