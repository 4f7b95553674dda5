//! `keypool demo` follows the spec: run for 3 s, then check the summary's facts (taken
//! from keypool's books and the simulator's counters, not from timing).

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

fn run_demo(extra: &[&str]) -> (Value, String) {
    let cwd = std::env::temp_dir().join(format!("keypool-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&cwd).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keypool"))
        .args(["demo", "--duration", "3s", "--rps", "20", "--json"])
        .args(extra)
        .current_dir(&cwd)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "demo failed:\n{stderr}");
    // No state file (or anything else) is written where the demo runs.
    let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
    assert!(left.is_empty(), "the demo wrote into its folder: {left:?}");
    std::fs::remove_dir_all(&cwd).unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not the JSON report ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (report, stderr)
}

fn account<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no account {id} in {report}"))
}

#[test]
fn the_demo_follows_the_spec() {
    let (report, stderr) = run_demo(&[]);
    let requests = report["requests"].as_u64().unwrap();
    // 20 requests/s for 3 s (60 ticks, the first immediate); a loaded machine may delay
    // ticks (missed ones are not made up), never add any.
    assert!((20..=61).contains(&requests), "{requests} requests");
    // Every request finds a working account: the plan holds the whole pool.
    assert_eq!(report["succeeded"].as_u64(), Some(requests), "{report}");
    assert!(report["streamed"].as_u64().unwrap() >= requests / 2 - 1);
    assert!(report["ttft_p50_ms"].as_u64().is_some());

    // The revoked key's 401 disables it (SPEC 6: key_error), after exactly its first answer.
    let revoked = account(&report, "revoked");
    assert_eq!(revoked["state"], "disabled", "{revoked}");
    assert!(
        revoked["reason"].as_str().unwrap().contains("401"),
        "{revoked}"
    );
    assert_eq!(revoked["served"], 0);
    assert!(revoked["upstream_calls"].as_u64().unwrap() >= 1);
    assert_eq!(revoked["calls_after_first_answer"], 0, "{revoked}");

    // The exhausted window keeps the account out until its reset: never called again
    // after its first answer (SPEC 5).
    let exhausted = account(&report, "exhausted");
    assert_eq!(exhausted["state"], "out_of_window", "{exhausted}");
    assert!(
        exhausted["reason"]
            .as_str()
            .unwrap()
            .starts_with("5h window"),
        "{exhausted}"
    );
    assert_eq!(exhausted["served"], 0);
    assert!(exhausted["upstream_calls"].as_u64().unwrap() >= 1);
    assert_eq!(exhausted["calls_after_first_answer"], 0, "{exhausted}");

    // Failovers happened and are counted by trigger.
    let triggers: Vec<&str> = report["failovers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["trigger"].as_str().unwrap())
        .collect();
    for t in ["auth_rejected", "window_exhausted"] {
        assert!(triggers.contains(&t), "no {t} failover in {triggers:?}");
    }
    assert!(report["attempts_per_request"].as_f64().unwrap() > 1.0);
    // The healthy accounts served; the shares add up to the successes.
    let served: u64 = report["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["served"].as_u64().unwrap())
        .sum();
    assert_eq!(served, requests);
    assert!(account(&report, "fast")["served"].as_u64().unwrap() > 0);

    // Usage per caller, from keypool's ledger: request n is ci-bot's when n % 3 == 2;
    // every answer is 180 input, 60 output and 2,400 cache-read tokens.
    let callers = report["callers"].as_array().unwrap();
    let caller = |id: &str| {
        callers
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no caller {id} in {report}"))
    };
    let (alice, bot) = (caller("alice"), caller("ci-bot"));
    assert_eq!(
        alice["requests"].as_u64().unwrap() + bot["requests"].as_u64().unwrap(),
        requests
    );
    assert_eq!(bot["requests"].as_u64().unwrap(), (requests + 1) / 3);
    for (c, input_per_m, output_per_m, read_per_m) in
        [(alice, 3_000, 15_000, 300), (bot, 1_000, 5_000, 100)]
    {
        let n = c["requests"].as_u64().unwrap();
        assert_eq!(c["input_tokens"].as_u64(), Some(180 * n), "{c}");
        assert_eq!(c["output_tokens"].as_u64(), Some(60 * n), "{c}");
        assert_eq!(
            c["cache_read_input_tokens"].as_u64(),
            Some(2_400 * n),
            "{c}"
        );
        // Nano-USD: tokens x USD per million x 1,000.
        let cost = n * (180 * input_per_m + 60 * output_per_m + 2_400 * read_per_m);
        assert_eq!(c["cost_nano_usd"].as_u64(), Some(cost), "{c}");
    }
    assert!(stderr.contains("Usage by caller today"), "{stderr}");

    // The readable summary (stderr with --json) names what a user needs.
    assert!(
        stderr.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:"),
        "{stderr}"
    );
    assert!(stderr.contains("ANTHROPIC_API_KEY=sk-lb-"), "{stderr}");
    assert!(stderr.contains("revoked is disabled"), "{stderr}");
    // Not a TTY: plain periodic progress lines, no terminal escapes.
    assert!(stderr.contains("] requests "), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "escape sequences on a non-terminal"
    );
}

#[test]
fn demo_flags_are_checked() {
    let out = Command::new(env!("CARGO_BIN_EXE_keypool"))
        .args(["demo", "--duration", "ten"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
}
