//! Issue 21, what ships for deployment (`Dockerfile`, `deploy/`): no container engine
//! runs on the project's machines, so these tests check what can be checked here. Every
//! YAML file parses; the Kubernetes manifests hold the objects a deployment needs; the
//! configuration the compose file and the ConfigMap carry passes `keypool
//! check-config`; and the real binary, started on that configuration (with only its
//! addresses moved to free loopback ports), answers the probe paths the Deployment,
//! the compose file and the Dockerfile use, on the ports they name.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use keypool_proxy::route::{RouteMatch, match_path};
use keypool_store::testing::TempDir;
use keypool_tests::process::{KeypoolProcess, free_port, keypool_command};
use keypool_tests::{Client, workspace_root};
use yaml_rust2::{Yaml, YamlLoader};

fn deploy(path: &str) -> PathBuf {
    workspace_root().join("deploy").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of `path`.
fn yaml(path: &Path) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

/// A YAML list of strings.
fn strings<'a>(y: &'a Yaml, what: &str) -> Vec<&'a str> {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what} is not a list: {y:?}"))
        .iter()
        .map(|v| str_of(v, what))
        .collect()
}

/// Every file under `dir` whose name ends with one of `suffixes`, sorted.
fn files(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path, suffixes));
        } else if suffixes.iter().any(|s| path.to_string_lossy().ends_with(s)) {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The Kubernetes objects of `deploy/kubernetes`, by `kind/name`.
fn manifests() -> BTreeMap<String, Yaml> {
    let mut objects = BTreeMap::new();
    for file in files(&deploy("kubernetes"), &[".yaml"]) {
        for doc in yaml(&file) {
            let kind = str_of(&doc["kind"], "kind").to_owned();
            if kind == "Kustomization" {
                continue;
            }
            let name = str_of(&doc["metadata"]["name"], "metadata.name");
            assert!(
                doc["apiVersion"].as_str().is_some(),
                "{kind}/{name} has no apiVersion"
            );
            objects.insert(format!("{kind}/{name}"), doc);
        }
    }
    objects
}

/// `host:port` → the port.
fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// `server.<key>` of a keypool.toml.
fn server_value(toml_text: &str, key: &str) -> String {
    let table: toml::Table = toml_text.parse().unwrap();
    table["server"][key].as_str().unwrap().to_owned()
}

#[test]
fn every_yaml_file_parses_and_the_manifests_hold_what_a_deployment_needs() {
    for file in files(&deploy(""), &[".yaml", ".yml"]) {
        assert!(!yaml(&file).is_empty(), "{} is empty", file.display());
    }
    let dashboards = files(&deploy("grafana"), &[".json"]);
    assert!(!dashboards.is_empty());
    for file in dashboards {
        let dashboard: serde_json::Value = serde_json::from_str(&read(&file)).unwrap();
        assert!(
            dashboard["panels"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
        );
    }
    let objects = manifests();
    let kinds: BTreeSet<&str> = objects
        .keys()
        .map(|k| k.split('/').next().unwrap())
        .collect();
    for kind in [
        "Namespace",
        "Deployment",
        "ConfigMap",
        "Secret",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "NetworkPolicy",
    ] {
        assert!(
            kinds.contains(kind),
            "no {kind} in deploy/kubernetes: {kinds:?}"
        );
    }
    // the kustomization lists every manifest file
    let kustomization = &yaml(&deploy("kubernetes/kustomization.yaml"))[0];
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|r| str_of(r, "resource").to_owned())
        .collect();
    let present: BTreeSet<String> = files(&deploy("kubernetes"), &[".yaml"])
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|f| f != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);

    let deployment = &objects["Deployment/keypool"];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert!(deployment["spec"]["replicas"].as_i64().unwrap() >= 2);
    // the drain fits in the grace period
    let config = read_configmap(&objects);
    let grace: i64 = config.parse::<toml::Table>().unwrap()["server"]["shutdown_grace_secs"]
        .as_integer()
        .unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap() > grace);
    // the PDB and the ServiceMonitor select the Deployment's pods
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(
        &objects["PodDisruptionBudget/keypool"]["spec"]["selector"]["matchLabels"],
        labels
    );
    assert_eq!(
        &objects["ServiceMonitor/keypool"]["spec"]["selector"]["matchLabels"],
        labels
    );
    assert_eq!(
        &objects["NetworkPolicy/keypool"]["spec"]["podSelector"]["matchLabels"],
        labels
    );
}

fn read_configmap(objects: &BTreeMap<String, Yaml>) -> String {
    str_of(
        &objects["ConfigMap/keypool-config"]["data"]["keypool.toml"],
        "keypool.toml",
    )
    .to_owned()
}

/// The named container ports of the Deployment: name → port.
fn container_ports(deployment: &Yaml) -> BTreeMap<String, u16> {
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| {
            (
                str_of(&p["name"], "port name").to_owned(),
                u16::try_from(p["containerPort"].as_i64().unwrap()).unwrap(),
            )
        })
        .collect()
}

/// Writes `text` to a folder's keypool.toml.
fn config_file(label: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(label).unwrap();
    let file = dir.path().join("keypool.toml");
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

/// The binary started on `file` with its addresses moved to free loopback ports and
/// Redis unreachable (it serves from memory: /readyz stays 200): the public and
/// admin ports.
async fn start_on(file: &Path, env: &[(&str, &str)]) -> (KeypoolProcess, u16, u16) {
    let (public, admin) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{public}");
    let admin_listen = format!("127.0.0.1:{admin}");
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.retain(|(k, _)| *k != "REDIS_URL");
    env.extend([
        ("KEYPOOL_LISTEN", listen.as_str()),
        ("KEYPOOL_ADMIN_LISTEN", admin_listen.as_str()),
        ("REDIS_URL", "redis://127.0.0.1:1/0"),
    ]);
    let k = KeypoolProcess::start_with(file, public, &[], &env).await;
    (k, public, admin)
}

async fn status(url: String) -> (u16, String) {
    let r = Client::new().request(http::Method::GET, url).send().await;
    (r.status.as_u16(), r.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_config_validates_and_the_probes_match_the_binary() {
    let objects = manifests();
    let config = read_configmap(&objects);
    // the Secret provides every $NAME the config reads
    let secret: Vec<(String, String)> = objects["Secret/keypool-secrets"]["stringData"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| (str_of(k, "key").to_owned(), str_of(v, "value").to_owned()))
        .collect();
    let env: Vec<(&str, &str)> = secret
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (_dir, file) = config_file("k8s-config", &config);
    let path = file.display().to_string();
    let (code, out, err) = keypool_command(&["check-config", &path], &env);
    assert_eq!(code, Some(0), "{out}{err}");
    // the inactive account's variable may be unset: the example stays valid without it
    let without: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .filter(|(k, _)| *k != "ANTHROPIC_KEY_1")
        .collect();
    let (code, out, err) = keypool_command(&["check-config", &path], &without);
    assert_eq!(code, Some(0), "{out}{err}");

    // ports: container ports = the config's listeners; Service, ServiceMonitor and
    // NetworkPolicy use them
    let deployment = &objects["Deployment/keypool"];
    let ports = container_ports(deployment);
    assert_eq!(ports["http"], port_of(&server_value(&config, "listen")));
    assert_eq!(
        ports["admin"],
        port_of(&server_value(&config, "admin_listen"))
    );
    let service_ports: BTreeSet<(String, String)> = objects["Service/keypool"]["spec"]["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| {
            (
                str_of(&p["name"], "name").to_owned(),
                str_of(&p["targetPort"], "targetPort").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        service_ports,
        BTreeSet::from([
            ("admin".into(), "admin".into()),
            ("http".into(), "http".into())
        ])
    );
    let monitor = &objects["ServiceMonitor/keypool"]["spec"]["endpoints"][0];
    assert_eq!(str_of(&monitor["port"], "port"), "admin");
    assert_eq!(
        match_path(str_of(&monitor["path"], "path")),
        RouteMatch::Metrics
    );
    let policy = &objects["NetworkPolicy/keypool"]["spec"]["ingress"];
    let policy_ports: Vec<i64> = policy
        .as_vec()
        .unwrap()
        .iter()
        .map(|rule| rule["ports"][0]["port"].as_i64().unwrap())
        .collect();
    assert_eq!(
        policy_ports,
        vec![i64::from(ports["http"]), i64::from(ports["admin"])]
    );
    // the admin rule has sources; the client rule is open to the cluster
    assert!(policy[0]["from"].is_badvalue());
    assert!(!policy[1]["from"].as_vec().unwrap().is_empty());

    // the probes, against the real binary on this config
    let (k, public, admin) = start_on(&file, &env).await;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        let path = str_of(&get["path"], "path");
        assert!(
            matches!(match_path(path), RouteMatch::Health | RouteMatch::Ready),
            "{probe} {path}"
        );
        let port = match str_of(&get["port"], "port") {
            "http" => public,
            "admin" => admin,
            other => panic!("{probe} names port {other}"),
        };
        let (code, body) = status(format!("http://127.0.0.1:{port}{path}")).await;
        assert_eq!(code, 200, "{probe} {path}: {body}\n{}", k.logs());
    }
    // ready while Redis is unreachable, and says so
    let (code, body) = status(format!("http://127.0.0.1:{public}/readyz")).await;
    assert_eq!(code, 200);
    assert!(
        body.contains("redis is configured but unreachable"),
        "{body}"
    );
    // the admin listener keeps /metrics internal
    assert_eq!(
        status(format!("http://127.0.0.1:{public}/metrics")).await.0,
        404
    );
    assert_eq!(
        status(format!("http://127.0.0.1:{admin}/metrics")).await.0,
        200
    );
    drop(k);
}

/// `KEY=value` lines joined across `\` continuations, by instruction.
fn dockerfile() -> Vec<(String, String)> {
    let text = read(&workspace_root().join("Dockerfile"));
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') && current.is_empty() || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let (instruction, rest) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((instruction.to_ascii_uppercase(), rest.trim().to_owned()));
                current.clear();
            }
        }
    }
    out
}

/// A compose service with its `<<` merge key applied (yaml-rust2 keeps YAML 1.1 merge
/// keys as plain keys).
fn merged(service: &Yaml) -> BTreeMap<String, Yaml> {
    let mut out = BTreeMap::new();
    let hash = service.as_hash().unwrap();
    if let Some(base) = hash.get(&Yaml::String("<<".into())) {
        for (k, v) in base.as_hash().unwrap() {
            out.insert(str_of(k, "key").to_owned(), v.clone());
        }
    }
    for (k, v) in hash {
        if k.as_str() != Some("<<") {
            out.insert(str_of(k, "key").to_owned(), v.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dockerfile_and_the_compose_file_run_the_binary_the_way_it_answers() {
    let compose = &yaml(&deploy("compose.yaml"))[0];
    let services = compose["services"].as_hash().unwrap();
    let names: BTreeSet<&str> = services.keys().map(|k| str_of(k, "service")).collect();
    assert_eq!(
        names,
        BTreeSet::from(["keypool-1", "keypool-2", "prometheus", "redis", "sim"])
    );
    let config_text = read(&deploy("compose/keypool.toml"));
    let admin_port = port_of(&server_value(&config_text, "admin_listen"));
    let public_port = port_of(&server_value(&config_text, "listen"));

    // the Dockerfile: multi-stage, a non-root runtime, the probe as health check,
    // the config's ports exposed, the commit passed to build.rs
    let instructions = dockerfile();
    let froms = instructions.iter().filter(|(i, _)| i == "FROM").count();
    assert!(froms >= 2, "multi-stage: {froms} FROM");
    let runtime_start = instructions.iter().rposition(|(i, _)| i == "FROM").unwrap();
    let runtime = &instructions[runtime_start..];
    let user = runtime
        .iter()
        .rev()
        .find(|(i, _)| i == "USER")
        .map(|(_, v)| v.as_str());
    assert!(
        user.is_some_and(|u| !u.starts_with("root") && !u.starts_with("0")),
        "the runtime stage runs as {user:?}"
    );
    let expose: BTreeSet<u16> = runtime
        .iter()
        .filter(|(i, _)| i == "EXPOSE")
        .flat_map(|(_, v)| v.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    assert_eq!(expose, BTreeSet::from([public_port, admin_port]));
    assert!(
        instructions
            .iter()
            .any(|(i, v)| i == "ARG" && v.starts_with("KEYPOOL_GIT_COMMIT"))
    );
    // the shipped keypool is the PGO build unless PGO=0 is asked for
    let build = &instructions[..runtime_start];
    assert!(build.iter().any(|(i, v)| i == "ARG" && v == "PGO=1"));
    let run = &build.iter().rfind(|(i, _)| i == "RUN").unwrap().1;
    assert!(
        run.contains("if [ \"$PGO\" = 1 ]")
            && run.contains("rustup component add llvm-tools")
            && run.contains("cargo xtask pgo --out /tmp/keypool")
            && run.contains("install -D -m 0755 /tmp/keypool /out/keypool"),
        "{run}"
    );
    let healthcheck = &runtime.iter().find(|(i, _)| i == "HEALTHCHECK").unwrap().1;
    let exec: Vec<String> =
        serde_json::from_str(healthcheck.split_once("CMD").unwrap().1.trim()).unwrap();
    assert_eq!(exec[1..3], ["probe".to_owned(), "--config".to_owned()]);
    let image_config = &exec[3];
    assert!(
        runtime.iter().any(|(i, v)| i == "COPY"
            && v.ends_with(&format!("deploy/compose/keypool.toml {image_config}"))),
        "the health check reads the config the image carries"
    );

    // the compose replicas: same health check, the config mounted where the probe reads
    let mut env: Vec<(String, String)> = Vec::new();
    for name in ["keypool-1", "keypool-2"] {
        let service = merged(&services[&Yaml::String(name.into())]);
        let test: Vec<&str> = strings(&service["healthcheck"]["test"], "test");
        assert_eq!(
            test[2..],
            ["probe", "--config", image_config.as_str()],
            "{name}"
        );
        let volumes: Vec<&str> = strings(&service["volumes"], "volume");
        assert!(
            volumes.contains(&format!("./compose/keypool.toml:{image_config}:ro").as_str()),
            "{volumes:?}"
        );
        let ports: Vec<&str> = strings(&service["ports"], "port");
        assert!(
            ports
                .iter()
                .any(|p| p.ends_with(&format!(":{public_port}"))),
            "{name} publishes the client port"
        );
        let grace = str_of(&service["stop_grace_period"], "stop_grace_period");
        assert!(grace.trim_end_matches('s').parse::<u64>().unwrap() > 30);
        env.clear();
        for (k, v) in service["environment"].as_hash().unwrap() {
            let value = str_of(v, "value");
            // ${NAME:?…} is the operator's to set: any value
            let value = if value.starts_with("${") {
                "set-by-the-operator".to_owned()
            } else {
                value.to_owned()
            };
            env.push((str_of(k, "name").to_owned(), value));
        }
    }
    let env_names: BTreeSet<String> = env.iter().map(|(k, _)| k.clone()).collect();
    assert!(env_names.contains("REDIS_URL") && env_names.contains("KEYPOOL_ADMIN_TOKEN"));
    // Prometheus scrapes both replicas on the admin port and loads the rules
    let prometheus = &yaml(&deploy("prometheus/prometheus.yml"))[0];
    let targets: Vec<&str> = strings(
        &prometheus["scrape_configs"][0]["static_configs"][0]["targets"],
        "target",
    );
    assert_eq!(
        targets,
        vec![
            format!("keypool-1:{admin_port}"),
            format!("keypool-2:{admin_port}")
        ]
    );
    assert_eq!(
        match_path(str_of(
            &prometheus["scrape_configs"][0]["metrics_path"],
            "path"
        )),
        RouteMatch::Metrics
    );
    let rules = str_of(&prometheus["rule_files"][0], "rule file");
    let prometheus_service = merged(&services[&Yaml::String("prometheus".into())]);
    let mounts: Vec<&str> = strings(&prometheus_service["volumes"], "volume");
    assert!(
        mounts.contains(&format!("./prometheus/keypool-rules.yaml:{rules}:ro").as_str()),
        "{mounts:?}"
    );
    // every file the compose file mounts exists
    for mount in mounts {
        let source = mount.split(':').next().unwrap();
        assert!(deploy(source).exists(), "{source}");
    }

    // the config validates with that environment, and the image's health check
    // command passes against the binary serving it
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (_dir, file) = config_file("compose-config", &config_text);
    let path = file.display().to_string();
    let (code, out, err) = keypool_command(&["check-config", &path], &env);
    assert_eq!(code, Some(0), "{out}{err}");
    let (k, _public, admin) = start_on(&file, &env).await;
    let admin_listen = format!("127.0.0.1:{admin}");
    let (code, body, err) = keypool_command(
        &["probe", "--config", &path],
        &[("KEYPOOL_ADMIN_LISTEN", admin_listen.as_str())],
    );
    assert_eq!(code, Some(0), "{body}{err}\n{}", k.logs());
    assert!(body.starts_with("ready"), "{body}");
    drop(k);
}

#[test]
fn the_systemd_unit_serves_reloads_and_drains_like_the_binary() {
    let unit = read(&deploy("systemd/keypool.service"));
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
            .to_owned()
    };
    let start = value("ExecStart");
    assert!(start.contains(" serve --config "), "{start}");
    assert!(value("ExecStartPre").contains(" check-config "));
    assert_eq!(value("ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(value("KillSignal"), "SIGTERM");
    // longer than the default shutdown_grace_secs (30): streams can finish
    let stop: u64 = value("TimeoutStopSec").parse().unwrap();
    assert!(stop > 30, "TimeoutStopSec {stop}");
    // the flags it passes exist
    let (code, _, err) = keypool_command(&["--log-format", "json", "serve", "--help"], &[]);
    assert_eq!(code, Some(0), "{err}");
}
