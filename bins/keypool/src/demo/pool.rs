//! The demo's simulated accounts: six characters, their scripts, and the embedded
//! configuration that points keypool at them.

use std::fmt::Write as _;
use std::time::Duration;

use keypool_core::{Strategy, Window};
use keypool_sim::{Behaviour, Delay, ErrorReply, OkSpec, Script, SimConfig, UnifiedHeaders, Usage};

/// The org and custom URL of the demo pool: requests go to `/demo/team/v1/messages`.
pub const ORG: &str = "demo";
/// The custom URL of the demo pool.
pub const URL: &str = "team";

/// How far ahead the exhausted account's 5-hour window resets.
pub const EXHAUSTED_RESET: Duration = Duration::from_secs(3 * 3600 + 17 * 60);

/// One simulated account.
#[derive(Debug, Clone)]
pub struct DemoAccount {
    /// Account id (in keypool and in the simulator).
    pub id: &'static str,
    /// What it does, for the table.
    pub character: &'static str,
    /// `api_key` or `oauth`.
    pub auth: &'static str,
}

/// The six accounts, in table order.
pub const ACCOUNTS: [DemoAccount; 6] = [
    DemoAccount {
        id: "fast",
        character: "fast: ~40 ms to first token",
        auth: "oauth",
    },
    DemoAccount {
        id: "slow",
        character: "slow: ~700 ms to first token",
        auth: "api_key",
    },
    DemoAccount {
        id: "flaky",
        character: "flaky: every 4th answer is 529",
        auth: "oauth",
    },
    DemoAccount {
        id: "limited",
        character: "every 3rd answer 429, retry-after 2 s",
        auth: "api_key",
    },
    DemoAccount {
        id: "exhausted",
        character: "5-hour window used up (429 rejected)",
        auth: "oauth",
    },
    DemoAccount {
        id: "revoked",
        character: "revoked key: answers 401",
        auth: "api_key",
    },
];

/// One of the demo's callers: an LB key of its own, a model, a share of the traffic.
#[derive(Debug, Clone, Copy)]
pub struct DemoCaller {
    /// The key's id (the caller in usage and logs).
    pub id: &'static str,
    /// `user` or `client`.
    pub kind: &'static str,
    /// The model its requests ask for.
    pub model: &'static str,
}

/// The two callers: request `n` is `alice`'s unless `n % 3 == 2` (then `ci-bot`'s).
pub const CALLERS: [DemoCaller; 2] = [
    DemoCaller {
        id: "alice",
        kind: "user",
        model: "claude-sonnet-4-5",
    },
    DemoCaller {
        id: "ci-bot",
        kind: "client",
        model: "claude-haiku-4-5",
    },
];

/// The caller of request `n`.
pub fn caller_of(n: u64) -> usize {
    usize::from(n % 3 == 2)
}

/// The fake credential the simulator knows `id` by.
pub fn credential(id: &str) -> String {
    format!("sk-ant-demo-{id}-not-a-real-key")
}

/// How many scripted requests a repeating pattern is unrolled to (the scripts' sequence
/// is consumed once; past it every account answers its default).
const UNROLL: usize = 20_000;

fn answer(ttft_ms: (u64, u64), chunks: u32, interval_ms: u64) -> OkSpec {
    OkSpec::default()
        .ttft(Delay::uniform_ms(ttft_ms.0, ttft_ms.1))
        .latency(Delay::uniform_ms(ttft_ms.0 + 20, ttft_ms.1 + 60))
        .chunks(chunks)
        .chunk_interval(Delay::ms(interval_ms))
        .text("Hello from the simulated upstream. ")
        // A coding assistant's typical answer: most of the prompt read from the cache.
        .usage(Usage {
            input_tokens: 180,
            output_tokens: 60,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 2_400,
        })
}

fn repeating(pattern: &[Behaviour], default: Behaviour) -> Script {
    let mut script = Script::new(default);
    for behaviour in pattern.iter().cycle().take(UNROLL) {
        script = script.then(behaviour.clone());
    }
    script
}

/// The simulator's accounts at `now_unix_s`.
pub fn sim_config(now_unix_s: u64) -> SimConfig {
    let fast = answer((30, 50), 6, 15);
    let slow = answer((600, 800), 6, 60);
    let flaky = answer((60, 120), 6, 20);
    let limited = answer((80, 140), 6, 20);
    let five_h = |util: f64, hours: u64, status: &'static str| {
        UnifiedHeaders::allowed()
            .window(Window::FiveHour, util, now_unix_s + hours * 3600, status)
            .window(
                Window::Weekly,
                util / 3.0,
                now_unix_s + 4 * 86_400,
                "allowed",
            )
    };
    let reset = now_unix_s + EXHAUSTED_RESET.as_secs();
    let mut exhausted_headers = UnifiedHeaders::rejected(reset);
    exhausted_headers = exhausted_headers
        .window(Window::FiveHour, 1.0, reset, "rejected")
        .window(Window::Weekly, 0.64, now_unix_s + 2 * 86_400, "allowed");
    let overloaded = Behaviour::status(529);
    let rate_limited: Behaviour = ErrorReply::rate_limited().retry_after_secs(2).into();
    SimConfig::new()
        .seed(0x6b65_7970_6f6f_6c64)
        .record_limit(64)
        .account(
            "fast",
            credential("fast"),
            Script::new(fast).unified(&five_h(0.42, 3, "allowed")),
        )
        .account("slow", credential("slow"), Script::new(slow))
        .account(
            "flaky",
            credential("flaky"),
            repeating(
                &[
                    flaky.clone().into(),
                    flaky.clone().into(),
                    flaky.clone().into(),
                    overloaded,
                ],
                flaky.into(),
            )
            .unified(&five_h(0.83, 1, "allowed_warning")),
        )
        .account(
            "limited",
            credential("limited"),
            repeating(
                &[limited.clone().into(), limited.clone().into(), rate_limited],
                limited.into(),
            ),
        )
        .account(
            "exhausted",
            credential("exhausted"),
            Script::new(ErrorReply::rate_limited().unified(&exhausted_headers)),
        )
        .account(
            "revoked",
            credential("revoked"),
            Script::new(Behaviour::status(401)),
        )
}

/// The embedded configuration: memory state only (no state file, no Redis), one org
/// `demo` whose URL config `team` uses a group of the six accounts.
///
/// `key_lines` holds each of [`CALLERS`]' `sha256 = …` line, in order.
pub fn config_toml(
    sim_base_url: &str,
    strategy: Strategy,
    key_lines: &[String; CALLERS.len()],
    admin_token: &str,
) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "[server]\nstate_file = \"\"\nsnapshot_ttl_secs = 1\nshutdown_grace_secs = 2\n\
         upstream_timeout_secs = 20\nhedge_budget = 0.5\n\n[admin]\ntoken = \"{admin_token}\"\n\n\
         [[orgs]]\nslug = \"{ORG}\""
    );
    for a in &ACCOUNTS {
        let _ = writeln!(
            t,
            "\n[[accounts]]\nid = \"{id}\"\norg = \"{ORG}\"\nprovider = \"anthropic\"\n\
             auth = \"{auth}\"\nsecret = \"{secret}\"\nbase_url = \"{sim_base_url}\"",
            id = a.id,
            auth = a.auth,
            secret = credential(a.id),
        );
    }
    let ids: Vec<String> = ACCOUNTS.iter().map(|a| format!("\"{}\"", a.id)).collect();
    let _ = writeln!(
        t,
        "\n[[groups]]\nid = \"pool\"\norg = \"{ORG}\"\nstrategy = \"{}\"\naccounts = [{}]\n\n\
         [[urls]]\ncustom_url = \"{URL}\"\norg = \"{ORG}\"\ngroup = \"pool\"",
        strategy.as_str(),
        ids.join(", ")
    );
    for (caller, line) in CALLERS.iter().zip(key_lines) {
        let _ = writeln!(
            t,
            "\n[[keys]]\nid = \"{}\"\norg = \"{ORG}\"\nkind = \"{}\"\nurls = [\"*\"]\n{line}",
            caller.id, caller.kind
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_store::config::Config;

    #[test]
    fn the_embedded_config_is_valid_and_memory_only() {
        let toml = config_toml(
            "http://127.0.0.1:9",
            Strategy::RoundRobin,
            &[
                format!("sha256 = \"{}\"", "0".repeat(64)),
                format!("sha256 = \"{}\"", "1".repeat(64)),
            ],
            "admin-token",
        );
        let config = Config::from_toml_str(&toml, None, &|_| None).unwrap();
        assert_eq!(config.accounts().count(), ACCOUNTS.len());
        for caller in &CALLERS {
            let key = config.lb_key_by_id(caller.id).unwrap();
            assert_eq!(key.kind().as_str(), caller.kind);
        }
        assert!(config.server().state_file.is_none());
        assert!(config.server().redis_url.is_none());
        assert_eq!(
            config.admin().token.as_ref().map(|t| t.expose()),
            Some("admin-token")
        );
    }
}
