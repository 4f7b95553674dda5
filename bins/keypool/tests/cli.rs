//! The command line: exit codes scripts can trust, `keygen` output, `check-config`.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

fn keypool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keypool"))
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("keypool-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn keygen_prints_a_key_and_its_config_line() {
    let out = keypool().arg("keygen").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("sk-lb-") && lines[0].len() == 46);
    let hex = keypool_store::keys::hash_key(lines[0]).to_hex();
    assert_eq!(lines[1], format!("sha256 = \"{hex}\""));
}

#[test]
fn check_config_exit_codes() {
    let good = temp_file(
        "good.toml",
        "[server]\nstate_file = \"\"\n[[orgs]]\nslug = \"acme\"\n[[accounts]]\nid = \"a\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"sk-ant-very-secret\"\n",
    );
    let out = keypool().arg("check-config").arg(&good).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));

    let bad = temp_file(
        "bad.toml",
        "[server]\nbogus = 1\n[[accounts]]\nid = \"a\"\nsecret = \"sk-ant-very-secret\"\nweight = 500\n",
    );
    let out = keypool().arg("check-config").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.bogus"), "{stderr}");
    assert!(stderr.contains("accounts[0]"), "{stderr}");
    assert!(!stderr.contains("sk-ant-very-secret"));

    let missing = keypool()
        .args(["check-config", "/nonexistent/keypool.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    // `serve` refuses an invalid file the same way, before binding anything.
    let out = keypool()
        .args(["serve", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}

#[test]
fn usage_errors_exit_2_and_help_documents_the_exit_codes() {
    assert_eq!(
        keypool().arg("--bogus").output().unwrap().status.code(),
        Some(2)
    );
    let help = keypool().arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "serve",
        "check-config",
        "keygen",
        "Exit codes",
        "--log-format",
    ] {
        assert!(text.contains(needle), "{needle}");
    }
}

#[test]
fn serve_reports_an_address_in_use_with_exit_3() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = temp_file(
        "busy.toml",
        &format!("[server]\nlisten = \"{addr}\"\nstate_file = \"\"\n"),
    );
    let out = keypool()
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
    let _ = std::fs::remove_file(config);
}
