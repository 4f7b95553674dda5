//! SPEC 13: a change through the admin API rewrites the config document with
//! `toml_edit`: the comment-rich example file stays byte for byte the same except the
//! value changed; an invalid change writes nothing; `file:` and sealed secrets load.

// Test code may unwrap.
#![allow(clippy::unwrap_used)]

use keypool_store::Store;
use keypool_store::config::edit::{self, Entity, Target};
use keypool_store::config::{Config, sealed};
use keypool_store::document::{ChangeError, backup_path};
use keypool_store::testing::TempDir;
use serde_json::json;

const EXAMPLE: &str = include_str!("../../../examples/keypool.toml");
const KEY: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

fn env(name: &str) -> Option<String> {
    match name {
        "KEYPOOL_ADMIN_TOKEN" | "ACME_OAUTH_1" | "ACME_API_1" => Some(format!("value-of-{name}")),
        "KEYPOOL_SECRETS_KEY" => Some(KEY.to_owned()),
        _ => None,
    }
}

fn account(id: &str) -> Target {
    Target {
        entity: Entity::Account,
        org: None,
        id: id.into(),
    }
}

async fn example_store(dir: &TempDir) -> (Store, std::path::PathBuf) {
    let path = dir.path().join("keypool.toml");
    // No state file next to the example in the test's folder.
    let text = EXAMPLE.to_owned();
    std::fs::write(&path, &text).unwrap();
    let config = Config::from_toml_str(&text, Some(dir.path()), &env).unwrap();
    (Store::open(config).await.unwrap(), path)
}

#[tokio::test]
async fn the_example_file_changes_only_in_the_value_changed() {
    let dir = TempDir::new("document-golden").unwrap();
    let (store, path) = example_store(&dir).await;
    let fields = json!({"weight": 7}).as_object().unwrap().clone();
    let ((), diff) = store
        .change_config(&path, "PATCH /admin/accounts/acme-api-1", &env, |doc| {
            edit::change(doc, &account("acme-api-1"), &fields)
        })
        .await
        .unwrap();
    assert_eq!(diff.accounts_changed, ["acme-api-1"]);
    let after = std::fs::read_to_string(&path).unwrap();
    let expected = EXAMPLE.replacen(
        "weight = 3                           # for the weighted strategy",
        "weight = 7                           # for the weighted strategy",
        1,
    );
    assert_ne!(expected, EXAMPLE, "the golden line exists");
    assert_eq!(after, expected);
    // The previous version is kept, and the running config follows.
    assert_eq!(
        std::fs::read_to_string(backup_path(&path)).unwrap(),
        EXAMPLE
    );
    assert_eq!(
        store.config().account("acme-api-1").unwrap().weight().get(),
        7
    );
}

#[tokio::test]
async fn an_invalid_change_writes_nothing_and_reports_located_problems() {
    let dir = TempDir::new("document-invalid").unwrap();
    let (store, path) = example_store(&dir).await;
    let fields = json!({"weight": 101}).as_object().unwrap().clone();
    let err = store
        .change_config(&path, "PATCH /admin/accounts/acme-api-1", &env, |doc| {
            edit::change(doc, &account("acme-api-1"), &fields)
        })
        .await
        .unwrap_err();
    let ChangeError::Invalid(errors) = err else {
        panic!("{err:?}")
    };
    let locations: Vec<&str> = errors
        .issues()
        .iter()
        .map(|i| i.location.as_str())
        .collect();
    assert_eq!(locations, ["accounts[1].weight"]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), EXAMPLE);
    assert!(!backup_path(&path).exists());
}

#[test]
fn file_and_sealed_secrets_load_and_their_problems_never_show_a_secret() {
    let dir = TempDir::new("document-secrets").unwrap();
    let file = dir.path().join("a.secret");
    std::fs::write(&file, "sk-ant-api03-FROM-FILE\n").unwrap();
    let sealed = sealed::seal(Some(KEY), "sk-ant-api03-SEALED").unwrap();
    let text = |secret: &str| {
        format!(
            "[[orgs]]\nslug = \"acme\"\n[[accounts]]\nid = \"a\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"{secret}\"\n"
        )
    };
    let from_file =
        Config::from_toml_str(&text(&format!("file:{}", file.display())), None, &env).unwrap();
    assert_eq!(
        from_file.account("a").unwrap().secret().expose(),
        "sk-ant-api03-FROM-FILE",
        "the final line break is not part of it"
    );
    let opened = Config::from_toml_str(&text(&sealed), None, &env).unwrap();
    assert_eq!(
        opened.account("a").unwrap().secret().expose(),
        "sk-ant-api03-SEALED"
    );
    // Without the key, or with another, and a missing file: located, no secret shown.
    let no_key = Config::from_toml_str(&text(&sealed), None, &|_| None).unwrap_err();
    assert!(
        no_key
            .to_string()
            .contains("accounts[0].secret: KEYPOOL_SECRETS_KEY is not set")
    );
    let missing = Config::from_toml_str(&text("file:/nonexistent/x"), None, &env).unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("cannot read the secret file /nonexistent/x")
    );
    for e in [no_key.to_string(), missing.to_string()] {
        assert!(!e.contains("SEALED") && !e.contains("FROM-FILE"), "{e}");
    }
}
