//! `keypool keys …` and `keypool accounts …`: the everyday changes of SPEC 13 from the
//! shell, through a running keypool's admin API (so an operator never pastes a hash and
//! every replica's file or document stays the one source of truth). The admin token
//! comes from `KEYPOOL_ADMIN_TOKEN`; the address from `--url`, else from the config
//! file's listeners (the admin listener when there is one), else
//! `http://127.0.0.1:8080`. The answer's JSON goes to stdout; exit 0 on a 2xx answer.

use std::path::PathBuf;
use std::process::ExitCode;

use std::io::Write as _;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// Where the running keypool is.
#[derive(Debug, Args)]
pub struct Target {
    /// The admin API's base URL (`http://host:port`).
    #[arg(long, global = true, value_name = "URL")]
    url: Option<String>,
    /// The config file whose listener to use (instead of `--url`).
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// `keypool keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Create a key; prints it once (only its SHA-256 is stored).
    Create {
        /// The key's id (recorded as the caller).
        id: String,
        /// Its org.
        #[arg(long)]
        org: String,
        /// `user` or `client`.
        #[arg(long, default_value = "user")]
        kind: String,
        /// A custom_url it may use (repeat; default every URL of the org).
        #[arg(long = "url-config", value_name = "CUSTOM_URL")]
        urls: Vec<String>,
    },
    /// List the keys (never their hashes).
    List,
    /// Revoke a key: its next request gets 401.
    Revoke {
        /// The key's id.
        id: String,
    },
}

/// `keypool accounts …`.
#[derive(Debug, Subcommand)]
pub enum AccountsAction {
    /// Add an account.
    Add {
        /// Its id.
        id: String,
        /// Its org.
        #[arg(long)]
        org: String,
        /// `anthropic` or `anthropic_compatible`.
        #[arg(long, default_value = "anthropic")]
        provider: String,
        /// `api_key`, `oauth` or `bearer`.
        #[arg(long, default_value = "api_key")]
        auth: String,
        /// The credential: `$ENV_NAME`, `file:/path`, or a literal (stored sealed: the
        /// server needs KEYPOOL_SECRETS_KEY).
        #[arg(long)]
        secret: String,
        /// Its base URL (required for anthropic_compatible).
        #[arg(long)]
        base_url: Option<String>,
    },
    /// Disable an account now (runtime state; `enable` undoes it).
    Disable {
        /// Its id.
        id: String,
        /// Why (shown in the admin API and the status page).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Enable a disabled account.
    Enable {
        /// Its id.
        id: String,
    },
}

fn base_url(target: &Target) -> anyhow::Result<String> {
    if let Some(url) = &target.url {
        return Ok(url.trim_end_matches('/').to_owned());
    }
    if let Some(file) = &target.config {
        let (listen, admin) = keypool_store::config::listen_addresses(file)
            .with_context(|| format!("cannot read the listen addresses of {}", file.display()))?;
        return Ok(crate::probe::url_for(listen, admin, ""));
    }
    Ok("http://127.0.0.1:8080".to_owned())
}

/// Sends one admin request: its status and body.
fn send(
    target: &Target,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(u16, String)> {
    let token = std::env::var("KEYPOOL_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .context("set KEYPOOL_ADMIN_TOKEN to the admin token of the keypool to change")?;
    let url = format!("{}{path}", base_url(target)?);
    let auth = format!("Bearer {token}");
    let body = body.map(|b| b.to_string());
    crate::probe::request(method, &url, &[("authorization", &auth)], body.as_deref())
        .with_context(|| format!("{method} {url}"))
}

/// Sends one admin request and prints its answer.
fn call(
    target: &Target,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<ExitCode> {
    let (status, answer) = send(target, method, path, body)?;
    print_answer(status, &answer)
}

fn print_answer(status: u16, answer: &str) -> anyhow::Result<ExitCode> {
    let answer = answer.to_owned();
    match serde_json::from_str::<Value>(&answer) {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or(answer)),
        Err(_) => println!("{answer}"),
    }
    Ok(ExitCode::from(u8::from(!(200..300).contains(&status))))
}

/// `keypool oauth …`.
#[derive(Debug, Subcommand)]
pub enum OAuthAction {
    /// Log a subscription account in (PKCE): prints the URL to open, reads the code the
    /// page shows from stdin, and stores the account's tokens (sealed: the server needs
    /// KEYPOOL_SECRETS_KEY). For an existing account its tokens are replaced (and an
    /// `expired` account is enabled again).
    Login {
        /// The account's id.
        id: String,
        /// Its org (for a new account).
        #[arg(long)]
        org: Option<String>,
    },
}

/// `keypool oauth login`.
pub fn oauth(target: &Target, action: OAuthAction) -> anyhow::Result<ExitCode> {
    let OAuthAction::Login { id, org } = action;
    let (status, answer) = send(
        target,
        "POST",
        "/admin/oauth/start",
        Some(json!({"id": id, "org": org})),
    )?;
    if !(200..300).contains(&status) {
        return print_answer(status, &answer);
    }
    let started: Value = serde_json::from_str(&answer).context("the start answer is not JSON")?;
    let (Some(url), Some(state)) = (started["authorize_url"].as_str(), started["state"].as_str())
    else {
        anyhow::bail!("the start answer has no authorize_url or state: {answer}");
    };
    // Written without panicking when stderr is closed (the code may come from a script).
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "Open this URL, log in with the subscription of {id:?}, and paste the code the page shows:\n\n{url}\n"
    );
    let _ = write!(err, "code: ");
    let _ = err.flush();
    let mut code = String::new();
    std::io::stdin()
        .read_line(&mut code)
        .context("cannot read the code from stdin")?;
    let (status, answer) = send(
        target,
        "POST",
        "/admin/oauth/finish",
        Some(json!({"state": state, "code": code.trim()})),
    )?;
    print_answer(status, &answer)
}

/// `keypool keys …`.
pub fn keys(target: &Target, action: KeysAction) -> anyhow::Result<ExitCode> {
    match action {
        KeysAction::Create {
            id,
            org,
            kind,
            urls,
        } => {
            let urls = if urls.is_empty() {
                vec!["*".to_owned()]
            } else {
                urls
            };
            call(
                target,
                "POST",
                "/admin/keys",
                Some(json!({"id": id, "org": org, "kind": kind, "urls": urls})),
            )
        }
        KeysAction::List => call(target, "GET", "/admin/keys", None),
        KeysAction::Revoke { id } => {
            call(target, "POST", &format!("/admin/keys/{id}/revoke"), None)
        }
    }
}

/// `keypool accounts …`.
pub fn accounts(target: &Target, action: AccountsAction) -> anyhow::Result<ExitCode> {
    match action {
        AccountsAction::Add {
            id,
            org,
            provider,
            auth,
            secret,
            base_url,
        } => {
            let mut body =
                json!({"id": id, "org": org, "provider": provider, "auth": auth, "secret": secret});
            if let Some(u) = base_url {
                body["base_url"] = json!(u);
            }
            call(target, "POST", "/admin/accounts", Some(body))
        }
        AccountsAction::Disable { id, reason } => call(
            target,
            "POST",
            &format!("/admin/accounts/{id}/disable"),
            Some(reason.map_or_else(|| json!({}), |r| json!({"reason": r}))),
        ),
        AccountsAction::Enable { id } => call(
            target,
            "POST",
            &format!("/admin/accounts/{id}/enable"),
            None,
        ),
    }
}
