"""Deployment files, checked without a Docker engine or a cluster: parse them, check the wiring."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from fleetloop.cli.main import build_parser
from fleetloop.daemon.service.settings import env_name, walk
from tests.support.service import EXPORTED_METRICS

ROOT = Path(__file__).resolve().parents[2]
PORT = 9464


def _settings() -> set[str]:
    names = {
        env_name(next(o for o in a.option_strings if o.startswith("--")))
        for p, a in walk(build_parser(environ={}))
        if p == ("run",)
    }
    return names | {"FLEETLOOP_SASL_PASSWORD"}


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "docker" / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_image_is_slim_non_root_with_a_healthcheck_on_healthz() -> None:
    steps = _dockerfile()
    froms = [r for w, r in steps if w == "FROM"]
    assert all(f.startswith("python:3.11-slim") for f in froms)
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [r for w, r in final if w == "USER"]
    assert users, "the final stage must switch to a non-root user"
    assert users[-1].split(":")[0] not in ("root", "0")
    env = " ".join(r for w, r in final if w == "ENV")
    assert f"FLEETLOOP_HTTP_PORT={PORT}" in env
    assert f"EXPOSE {PORT}" in [f"{w} {r}" for w, r in final]
    health = [r for w, r in final if w == "HEALTHCHECK"]
    assert len(health) == 1
    assert f"http://127.0.0.1:{PORT}/healthz" in health[0]
    assert [r for w, r in final if w == "ENTRYPOINT"] == ['["fleetloop"]']
    assert [r for w, r in final if w == "CMD"] == ['["run"]']
    for var in re.findall(r"(FLEETLOOP_[A-Z_]+)=", env):
        assert var in _settings(), f"{var} is not a setting of fleetloop run"


def test_compose_wires_kafka_kraft_and_fleetloop() -> None:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text(encoding="utf-8"))
    kafka, fl = doc["services"]["kafka"], doc["services"]["fleetloop"]
    assert kafka["image"].startswith("apache/kafka:4.")
    kenv = kafka["environment"]
    assert "controller" in kenv["KAFKA_PROCESS_ROLES"]
    assert "broker" in kenv["KAFKA_PROCESS_ROLES"]
    advertised = kenv["KAFKA_ADVERTISED_LISTENERS"]
    env = fl["environment"]
    assert f"PLAINTEXT://{env['FLEETLOOP_BOOTSTRAP_SERVERS']}" == advertised
    assert env["FLEETLOOP_CREATE_TOPICS"] == "1"  # topics made by fleetloop from its registry
    assert set(env) <= _settings()
    assert fl["build"]["dockerfile"] == "docker/Dockerfile"
    assert (ROOT / "docker" / fl["build"]["context"] / fl["build"]["dockerfile"]).is_file()
    assert fl["ports"] == [f"127.0.0.1:{PORT}:{env['FLEETLOOP_HTTP_PORT']}"]
    assert fl["depends_on"]["kafka"]["condition"] == "service_healthy"
    args = build_parser(environ={k: str(v) for k, v in env.items()}).parse_args(fl["command"])
    assert args.http_port == PORT
    assert args.http_host == "0.0.0.0"
    assert args.bootstrap_servers == "kafka:9092"


def test_compose_runs_the_fleet_rollup_beside_the_daemon() -> None:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text(encoding="utf-8"))
    fl, rollup = doc["services"]["fleetloop"], doc["services"]["rollup"]
    assert rollup["image"] == fl["image"]  # the image compose builds for the daemon
    env = {k: str(v) for k, v in rollup["environment"].items()}
    args = build_parser(environ=env).parse_args(rollup["command"])
    assert rollup["command"] == ["rollup"]
    assert args.bootstrap_servers == fl["environment"]["FLEETLOOP_BOOTSTRAP_SERVERS"]
    run_args = build_parser(environ={k: str(v) for k, v in fl["environment"].items()}).parse_args(
        fl["command"]
    )
    assert args.group_id == run_args.group_id  # it rolls up the daemon's own consumer group
    assert args.topic_prefix == run_args.topic_prefix
    assert rollup["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert rollup["restart"] == "on-failure"  # until fleetloop has created control.summaries


def test_kubernetes_sidecar_probes_hit_the_daemons_endpoints() -> None:
    docs = list(
        yaml.safe_load_all(
            (ROOT / "deploy" / "kubernetes" / "fleetloop-sidecar.yaml").read_text(encoding="utf-8")
        )
    )
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    fl = next(c for c in spec["containers"] if c["name"] == "fleetloop")
    assert len(spec["containers"]) >= 2, "a sidecar sits beside something"
    env = {e["name"]: e.get("value") for e in fl["env"]}
    assert set(env) <= _settings()
    secret_ref = next(e for e in fl["env"] if e["name"] == "FLEETLOOP_SASL_PASSWORD")
    assert "secretKeyRef" in secret_ref["valueFrom"], "the password comes from a Secret, never a literal"
    ports = {p["name"]: p["containerPort"] for p in fl["ports"]}
    assert ports["probes"] == int(env["FLEETLOOP_HTTP_PORT"]) == PORT
    assert fl["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert fl["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    args = build_parser(
        environ={k: v for k, v in env.items() if v is not None} | {"FLEETLOOP_SASL_PASSWORD": "x"}
    ).parse_args(fl["args"])
    assert args.security_protocol == "SASL_SSL"
    assert args.http_host == "0.0.0.0"


def test_grafana_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "fleetloop.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bfleetloop_[a-z_]+", e)}
    assert used <= EXPORTED_METRICS, (
        f"dashboard queries metrics the daemon does not export: {used - EXPORTED_METRICS}"
    )
    wanted = {
        "events_consumed",
        "dead_letters",
        "decisions",
        "tick_duration",
        "ticks",
        "consumer_lag",
        "policy_info",
        "broker_connected",
        "model_nodes",
    }
    assert all(any(w in m for m in used) for w in wanted)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
