//! The architecture rules of `docs/ARCHITECTURE.md`, checked as ordinary tests (after
//! rust-analyzer's `xtask/src/tidy.rs`), so that `cargo xtask ci` fails when a change
//! breaks them:
//!
//! - every keypool crate depends only on the keypool crates its line of the "Dependency
//!   rules" block names (read from the document itself, so the two cannot drift; a
//!   `dev: a, b` note in the line's comment allows those as dev-dependencies);
//! - the policy crates (`core`, `selector`, `cooldown`, `sse`, `providers`) depend on no
//!   I/O crate (tokio, hyper, Redis, TLS, sockets), and `core` only on serde and
//!   thiserror;
//! - no source file of a policy crate reads the clock (`SystemTime::now`,
//!   `Instant::now`) outside its `#[cfg(test)]` module: time is an argument.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

/// The crates that must stay pure (ARCHITECTURE: "Architecture invariant").
const POLICY_CRATES: [&str; 6] = [
    "keypool-core",
    "keypool-selector",
    "keypool-cooldown",
    "keypool-sse",
    "keypool-providers",
    "keypool-ledger",
];

/// Crates that do I/O: none of them may be a dependency of a policy crate.
const IO_CRATES: [&str; 11] = [
    "tokio",
    "hyper",
    "hyper-util",
    "hyper-rustls",
    "rustls",
    "h2",
    "mio",
    "socket2",
    "fred",
    "redis",
    "reqwest",
];

/// What `keypool-core` may depend on ("serde + thiserror only").
const CORE_DEPENDENCIES: [&str; 2] = ["serde", "thiserror"];

/// Calls that read the clock.
const CLOCK_READS: [&str; 2] = ["SystemTime::now", "Instant::now"];

#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    manifest_path: String,
    dependencies: Vec<Dependency>,
}

#[derive(Debug, Deserialize)]
struct Dependency {
    name: String,
    kind: Option<String>,
}

/// One line of the "Dependency rules" block: the keypool crates a crate may use.
#[derive(Debug, Default, PartialEq, Eq)]
struct Rule {
    normal: BTreeSet<String>,
    dev: BTreeSet<String>,
}

/// The crate a short name of the block stands for (`core` → `keypool-core`,
/// `bins/keypool` → `keypool`, `tests` → `keypool-tests`, `xtask` → `xtask`).
fn package_name(short: &str) -> String {
    match short {
        "bins/keypool" => "keypool".to_owned(),
        "xtask" => "xtask".to_owned(),
        other => format!("keypool-{other}"),
    }
}

/// Parses the fenced block under `## Dependency rules`: `name -> a, b (comment)`, where
/// a comment may continue on indented lines and may hold `dev: x, y`.
fn parse_rules(architecture: &str) -> Result<BTreeMap<String, Rule>, String> {
    let section = architecture
        .split("## Dependency rules")
        .nth(1)
        .ok_or("docs/ARCHITECTURE.md has no `## Dependency rules` section")?;
    let block = section
        .split("```")
        .nth(1)
        .ok_or("the Dependency rules section has no fenced block")?;
    let mut rules: BTreeMap<String, Rule> = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (code, comment) = match line.find('(') {
            Some(at) => (&line[..at], &line[at..]),
            None => (line, ""),
        };
        if !code.trim().is_empty() {
            let (name, deps) = match code.split_once("->") {
                Some((name, deps)) => (name.trim(), deps),
                None => (code.trim(), ""),
            };
            let rule = Rule {
                normal: deps
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty() && !d.contains(' '))
                    .map(package_name)
                    .collect(),
                dev: BTreeSet::new(),
            };
            let package = package_name(name);
            rules.insert(package.clone(), rule);
            last = Some(package);
        }
        if let Some(dev) = comment.split("dev:").nth(1) {
            let current = last.as_ref().ok_or("a `dev:` note before any crate")?;
            let dev = dev.split([')', ';']).next().unwrap_or("");
            let rule = rules.get_mut(current).ok_or("unknown crate")?;
            rule.dev.extend(
                dev.split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(package_name),
            );
        }
    }
    if rules.is_empty() {
        return Err("the Dependency rules block names no crate".into());
    }
    Ok(rules)
}

/// Every broken rule of `metadata` against `rules`, one line each.
fn check_dependencies(metadata: &Metadata, rules: &BTreeMap<String, Rule>) -> Vec<String> {
    let ours: BTreeSet<&str> = metadata.packages.iter().map(|p| p.name.as_str()).collect();
    let mut problems = Vec::new();
    for package in &metadata.packages {
        let Some(rule) = rules.get(&package.name) else {
            problems.push(format!(
                "{}: not in docs/ARCHITECTURE.md's Dependency rules; add its line there",
                package.name
            ));
            continue;
        };
        for dep in &package.dependencies {
            let dev = dep.kind.as_deref() == Some("dev");
            let name = dep.name.as_str();
            if ours.contains(name)
                && !rule.normal.contains(name)
                && !(dev && rule.dev.contains(name))
            {
                problems.push(format!(
                    "{} -> {name}{}: an edge docs/ARCHITECTURE.md's Dependency rules do not allow (a new edge is a design change: make it there first)",
                    package.name,
                    if dev { " (dev)" } else { "" }
                ));
            }
            if dev || !POLICY_CRATES.contains(&package.name.as_str()) {
                continue;
            }
            if IO_CRATES.contains(&name) {
                problems.push(format!(
                    "{} -> {name}: a policy crate knows nothing of I/O (tokio, hyper, Redis, TLS); move the I/O to keypool-store or keypool-proxy",
                    package.name
                ));
            }
            if package.name == "keypool-core" && !CORE_DEPENDENCIES.contains(&name) {
                problems.push(format!(
                    "keypool-core -> {name}: core depends only on serde and thiserror"
                ));
            }
        }
    }
    problems
}

/// The clock reads in `source` outside its `#[cfg(test)]` items, as `(line, call)`.
fn clock_reads(source: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    let mut in_test = false;
    let mut depth = 0i64;
    let mut test_depth = 0i64;
    let mut pending_test = false;
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.trim_start().starts_with("#[cfg(test)]") {
            pending_test = true;
        }
        if pending_test && !in_test && code.contains('{') {
            in_test = true;
            pending_test = false;
            test_depth = depth;
        }
        if !in_test {
            for call in CLOCK_READS {
                if code.contains(call) {
                    found.push((i + 1, call));
                }
            }
        }
        depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
        if in_test && depth <= test_depth {
            in_test = false;
        }
    }
    found
}

fn metadata(root: &Path) -> Metadata {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON")
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        crate::project_root()
    }

    #[test]
    fn crates_depend_only_as_the_architecture_allows() {
        let architecture = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md"))
            .expect("docs/ARCHITECTURE.md");
        let rules = parse_rules(&architecture).unwrap_or_else(|e| panic!("{e}"));
        let problems = check_dependencies(&metadata(&root()), &rules);
        assert!(
            problems.is_empty(),
            "architecture rules broken:\n  {}",
            problems.join("\n  ")
        );
    }

    #[test]
    fn policy_crates_never_read_the_clock() {
        let metadata = metadata(&root());
        let mut problems = Vec::new();
        for package in metadata
            .packages
            .iter()
            .filter(|p| POLICY_CRATES.contains(&p.name.as_str()))
        {
            let dir = Path::new(&package.manifest_path)
                .parent()
                .expect("a manifest's folder")
                .join("src");
            let mut files = Vec::new();
            rust_files(&dir, &mut files);
            for file in files {
                let source = std::fs::read_to_string(&file).expect("a source file");
                for (line, call) in clock_reads(&source) {
                    problems.push(format!(
                        "{}:{line}: {call} in {}: a policy crate takes `now` as an argument",
                        file.display(),
                        package.name
                    ));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// The checks themselves fail when they should.
    #[test]
    fn the_checks_catch_what_they_are_for() {
        let rules = parse_rules(
            "## Dependency rules\n```\ncore      (serde + thiserror only)\nselector  -> core   (pure)\nproxy     -> core, selector\n          (the server; dev: sim)\nsim       -> core\nxtask     -> no keypool crate (dev: sim)\n```\n",
        )
        .unwrap();
        assert_eq!(
            rules["keypool-proxy"],
            Rule {
                normal: ["keypool-core", "keypool-selector"]
                    .map(String::from)
                    .into(),
                dev: ["keypool-sim"].map(String::from).into(),
            }
        );
        assert!(rules["xtask"].normal.is_empty());
        let package = |name: &str, deps: &[(&str, Option<&str>)]| Package {
            name: name.to_owned(),
            manifest_path: String::new(),
            dependencies: deps
                .iter()
                .map(|(n, k)| Dependency {
                    name: (*n).to_owned(),
                    kind: k.map(str::to_owned),
                })
                .collect(),
        };
        let metadata = Metadata {
            packages: vec![
                package("keypool-core", &[("serde", None), ("rand", None)]),
                package(
                    "keypool-selector",
                    &[
                        ("keypool-core", None),
                        ("tokio", None),
                        ("tokio", Some("dev")),
                    ],
                ),
                package(
                    "keypool-proxy",
                    &[("keypool-sim", Some("dev")), ("keypool-core", None)],
                ),
                package("keypool-sim", &[("keypool-proxy", None)]),
                package("xtask", &[("keypool-sim", Some("dev"))]),
            ],
        };
        let problems = check_dependencies(&metadata, &rules);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].starts_with("keypool-core -> rand: core depends only"));
        assert!(problems[1].starts_with("keypool-selector -> tokio: a policy crate"));
        assert!(problems[2].starts_with("keypool-sim -> keypool-proxy: an edge"));

        let source = "fn a() { let t = std::time::Instant::now(); }\n\
                      // SystemTime::now in a comment\n\
                      #[cfg(test)]\nmod tests {\n    fn b() { SystemTime::now(); }\n}\n\
                      fn c() { SystemTime::now(); }\n";
        assert_eq!(
            clock_reads(source),
            [(1, "Instant::now"), (7, "SystemTime::now")]
        );
    }
}
