"""The deployment bundles in deploy/, checked without a container runtime: Prometheus' own tools on the config and the
rules (with the rule unit tests), nginx's on its config, a Kubernetes schema validator on the manifests, the image's
build stage reproduced from exactly what its Dockerfile copies, and every flag, environment variable, port and path
the bundles use checked against the server as it is."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from bertzoo.cli import main as cli
from bertzoo.serving.config import ServeConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(DEPLOY))
import local  # noqa: E402  (deploy/local.py: the bundle's topology on loopback)

DOCKERFILES = [DEPLOY / "docker" / "Dockerfile", DEPLOY / "docker" / "Dockerfile.gpu"]
COMPOSE = DEPLOY / "compose" / "compose.yaml"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
BUNDLE_FILES = [*DOCKERFILES, COMPOSE, *K8S]


def needs(tool: str):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} is not installed (.ci/run installs it "
                                                                  "with apt-get; Debian package nginx / prometheus)")


def run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@needs("promtool")
def test_the_prometheus_rules_pass_promtool_and_their_unit_tests():
    assert "SUCCESS: 25 rules found" in run("promtool", "check", "rules", str(DEPLOY / "prometheus" / "rules.yml"))
    assert "SUCCESS" in run("promtool", "test", "rules", str(DEPLOY / "prometheus" / "rules_test.yml"))


@needs("promtool")
def test_the_prometheus_configs_are_valid(tmp_path):
    shipped = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    (tmp_path / "rules.yml").write_text((DEPLOY / "prometheus" / "rules.yml").read_text())
    (tmp_path / "compose.yml").write_text(shipped.replace("/etc/prometheus/rules.yml", str(tmp_path / "rules.yml")))
    run("promtool", "check", "config", str(tmp_path / "compose.yml"))
    (tmp_path / "local.yml").write_text(local.prometheus_config(["127.0.0.1:9400"]))
    run("promtool", "check", "config", str(tmp_path / "local.yml"))


@needs("nginx")
def test_the_nginx_config_passes_nginx_t(tmp_path):
    """The shipped file with only its upstream servers (the compose service name, unresolvable here), listen port and
    scratch paths replaced."""
    conf = tmp_path / "nginx.conf"
    for http in (False, True):
        conf.write_text(local.render_nginx_conf(["127.0.0.1:50061", "127.0.0.1:50062"], "127.0.0.1:50060", tmp_path,
                                                *((["127.0.0.1:8061", "127.0.0.1:8062"], "127.0.0.1:8060") if http
                                                  else ())))
        assert "test is successful" in run("nginx", "-t", "-p", str(tmp_path), "-c", str(conf))
        assert ("proxy_pass http://bertzoo_http;" in conf.read_text()) == http
    shipped = local.NGINX_CONF.read_text()
    for directive in ("grpc_pass grpc://bertzoo;", "grpc_next_upstream error timeout invalid_header non_idempotent;",
                      "listen 50051 http2;", "listen 8000;", "proxy_pass http://bertzoo_http;",
                      "proxy_next_upstream error timeout non_idempotent;"):
        assert directive in shipped


def test_the_kubernetes_manifests_validate_strictly():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for path in K8S:
        for document in yaml.safe_load_all(path.read_text()):
            if document["kind"] in ("ServiceMonitor", "Kustomization"):  # CRD / kustomize: no upstream schema
                assert document["apiVersion"] in ("monitoring.coreos.com/v1", "kustomize.config.k8s.io/v1beta1")
                continue
            kubernetes_validate.validate(document, "1.30", strict=True)  # raises on any unknown or wrong field
    kustomized = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    assert all((DEPLOY / "k8s" / name).is_file() for name in kustomized)


def test_the_http_probes_component_patches_the_deployment_into_a_valid_one_probing_health():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    component = DEPLOY / "k8s" / "http-probes"
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component" and kustomization["patches"] == [{"path": "probes.yaml"}]
    patch = yaml.safe_load((component / "probes.yaml").read_text())
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    assert patch["metadata"]["name"] == deployment["metadata"]["name"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    for patched in patch["spec"]["template"]["spec"]["containers"]:
        container = containers[patched["name"]]
        for probe, fields in patched.items():
            if probe != "name":  # strategic merge: a null removes the field
                merged = {**container[probe], **fields}
                container[probe] = {k: v for k, v in merged.items() if v is not None}
    kubernetes_validate.validate(deployment, "1.30", strict=True)
    container = containers["bertzoo"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"} and "grpc" not in container[probe]
    assert ports["http"] == 8000  # the image's --http-port


def test_the_validator_catches_a_wrong_field():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)


def _serve_params() -> dict[str, click.Parameter]:
    return {p.name: p for p in cli.commands["serve"].params}


def test_every_environment_variable_the_bundles_set_is_one_serve_reads():
    envvars = {p.envvar for p in _serve_params().values() if p.envvar}
    used = {name for path in BUNDLE_FILES for name in re.findall(r"\b(BERTZOO_[A-Z_0-9]+)\b", path.read_text())}
    used -= {"BERTZOO_ARTIFACT"}  # compose's own variable: the host directory to mount
    assert used and used <= envvars, used - envvars


def test_every_serve_flag_the_bundles_pass_exists():
    flags = {opt for p in _serve_params().values() for opt in [*p.opts, *p.secondary_opts]}
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    used = {a for a in args if a.startswith("--")}
    assert used and used <= flags, used - flags


def test_the_healthcheck_command_parses_and_the_ports_are_the_servers():
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        command = re.search(r'CMD \["bertzoo", (.*)\]', text).group(1)
        argv = [a.strip().strip('"') for a in command.split(",")]
        cli.commands[argv[0]].make_context(argv[0], argv[1:])  # raises on an unknown option or a bad value
        assert 'ENTRYPOINT ["bertzoo", "serve"]' in text and "USER 10001" in text
        assert f"BERTZOO_PORT={ServeConfig.port}" in text and f"BERTZOO_METRICS_PORT={ServeConfig.metrics_port}" in text
        assert f"BERTZOO_HTTP_PORT={ServeConfig.http_port}" in text
        assert re.search(rf"EXPOSE {ServeConfig.port} {ServeConfig.metrics_port} {ServeConfig.http_port}\b", text)
    deployment = (DEPLOY / "k8s" / "deployment.yaml").read_text()
    assert f"containerPort: {ServeConfig.port}" in deployment and f"containerPort: {ServeConfig.metrics_port}" in deployment
    assert f"containerPort: {ServeConfig.http_port}" in deployment
    assert f'prometheus.io/port: "{ServeConfig.metrics_port}"' in deployment
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["dns_sd_configs"][0]["port"] == ServeConfig.metrics_port


def test_the_drain_fits_in_the_grace_periods():
    """SIGTERM drains for --shutdown-grace seconds: the orchestrator must wait longer before SIGKILL."""
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    container = deployment["containers"][0]
    grace = float(container["args"][container["args"].index("--shutdown-grace") + 1])
    assert deployment["terminationGracePeriodSeconds"] > grace + container["lifecycle"]["preStop"]["sleep"]["seconds"]
    compose = yaml.safe_load(COMPOSE.read_text())["services"]["bertzoo"]
    assert float(compose["stop_grace_period"].rstrip("s")) > float(compose["environment"]["BERTZOO_SHUTDOWN_GRACE"])


def test_grafana_is_provisioned_with_the_shipped_dashboard():
    compose = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in compose["volumes"])
    dashboards = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "bertzoo.yml").read_text())
    path = dashboards["providers"][0]["options"]["path"]
    source = (COMPOSE.parent / next(host for host, inside in mounts.items() if inside == path)).resolve()
    assert (source / "bertzoo-dashboard.json").is_file()


def test_the_image_builds_from_what_its_dockerfile_copies(tmp_path):
    """The build stage, without Docker: only the paths the Dockerfile COPYs, built into a wheel."""
    for dockerfile in DOCKERFILES:
        copies = re.findall(r"^COPY (?!--from)(.+) (\S+)$", dockerfile.read_text(), re.M)
        assert copies == re.findall(r"^COPY (?!--from)(.+) (\S+)$", DOCKERFILES[0].read_text(), re.M)
    context = tmp_path / "context"
    context.mkdir()
    for sources, _ in copies:
        for name in sources.split():
            source = ROOT / name
            (shutil.copytree if source.is_dir() else shutil.copy)(source, context / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"),
        str(context))
    wheel = next((tmp_path / "w").glob("bertzoo-*.whl"))
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("bertzoo/cli.py", "bertzoo/serving/grpc_server.py", "bertzoo/serving/_proto/__init__.py",
                   "bertzoo/serving/grafana/bertzoo-dashboard.json"):
        assert module in names, module
