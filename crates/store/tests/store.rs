//! The store with the memory backend: snapshots, reload, the state file.

mod common;

use common::*;
use keypool_cooldown::{Classification, FailureClass, Trigger};
use keypool_core::AccountId;
use keypool_store::state::StateFileLoad;
use keypool_store::testing::TempDir;
use keypool_store::{BackendKind, BootState, Store, now_ms};

fn ids(c: &[keypool_selector::Candidate]) -> Vec<&str> {
    c.iter().map(|c| c.id.as_str()).collect()
}

#[tokio::test]
async fn snapshot_is_in_spec_order_and_follows_last_used() {
    let store = memory_store(4, 0).await;
    let c = store.config();
    let route = c.resolve("acme", "team").unwrap();
    let t = 1_000_000;
    // priorities: a0,a1 = 0; a2,a3 = 1; never used → id order
    assert_eq!(ids(&store.snapshot(&route, t)), ["a0", "a1", "a2", "a3"]);
    store.mark_used(&AccountId::from("a0"), t);
    assert_eq!(
        ids(&store.snapshot(&route, t + 1)),
        ["a1", "a0", "a2", "a3"]
    );
    store.mark_used(&AccountId::from("a1"), t + 5);
    store.mark_used(&AccountId::from("a2"), t + 1);
    assert_eq!(
        ids(&store.snapshot(&route, t + 6)),
        ["a0", "a1", "a3", "a2"]
    );
    let s = store.snapshot(&route, t + 6);
    assert_eq!(s[0].last_used, t);
    assert!(s.iter().all(|c| c.active));
}

#[tokio::test]
async fn snapshot_is_cached_for_snapshot_ttl() {
    let store = memory_store(2, 15).await;
    let c = store.config();
    let route = c.resolve("acme", "grp").unwrap();
    let t = 5_000_000;
    let first = store.snapshot(&route, t);
    assert_eq!(ids(&first), ["a0", "a1"]);
    store.mark_used(&AccountId::from("a0"), t + 1);
    let cached = store.snapshot(&route, t + 14_999);
    assert!(
        std::sync::Arc::ptr_eq(first.candidates(), cached.candidates()),
        "reused within 15 s"
    );
    assert_eq!(
        ids(&store.snapshot(&route, t + 15_000)),
        ["a1", "a0"],
        "rebuilt after 15 s"
    );
}

#[tokio::test]
async fn disabling_an_account_shows_at_once_despite_the_cache() {
    let store = Store::open(config(&config_text(2, "state_file = \"\"")))
        .await
        .unwrap();
    let c = store.config();
    let route = c.resolve("acme", "team").unwrap();
    let t = 1_000;
    assert!(store.snapshot(&route, t).iter().all(|c| c.active));
    let a1 = AccountId::from("a1");
    let key_error = Classification {
        class: FailureClass::KeyError,
        trigger: Trigger::AuthRejected { status: 401 },
    };
    let effect = store.record_failure(&attempt(&a1, t), &key_error, t);
    assert!(effect.disabled);
    let s = store.snapshot(&route, t + 1);
    assert_eq!(s.iter().find(|c| c.id == a1).map(|c| c.active), Some(false));
    assert!(store.reenable(&a1).is_some());
    assert!(store.snapshot(&route, t + 2).iter().all(|c| c.active));
}

#[tokio::test]
async fn reload_swaps_config_keeps_state_and_rejects_invalid_files() {
    let dir = TempDir::new("reload").unwrap();
    let path = dir.path().join("keypool.toml");
    std::fs::write(&path, config_text(3, "state_file = \"\"")).unwrap();
    let store = Store::open(keypool_store::config::Config::load(&path).unwrap())
        .await
        .unwrap();
    let now = now_ms();
    let a0 = AccountId::from("a0");
    let until = store
        .record_failure(
            &attempt(&a0, now),
            &window_exhausted(now + 3 * HOUR_MS),
            now,
        )
        .cooldown_until;
    assert_eq!(until, Some(now + 3 * HOUR_MS));

    // invalid: every problem returned, old config still serving
    std::fs::write(
        &path,
        config_text(3, "state_file = \"\"").replace("priority = 1", "priority = 1\nweight = 0"),
    )
    .unwrap();
    let err = store.reload(&path).unwrap_err();
    assert!(err.to_string().contains("accounts[2].weight"), "{err}");
    assert!(store.config().account("a2").is_some());

    // valid: a2 removed, a0 kept with its cooldown
    std::fs::write(&path, config_text(2, "state_file = \"\"")).unwrap();
    store.reload(&path).unwrap();
    assert!(store.config().account("a2").is_none());
    assert_eq!(
        store.health().cooldowns.cooldown_until(&a0, now + 1),
        Some(now + 3 * HOUR_MS)
    );
    let c = store.config();
    assert_eq!(
        ids(&store.snapshot(&c.resolve("acme", "team").unwrap(), now)),
        ["a0", "a1"]
    );
}

#[tokio::test]
async fn a_snapshot_names_its_accounts_only_for_the_config_it_was_taken_from() {
    let dir = TempDir::new("snapshot-accounts").unwrap();
    let path = dir.path().join("keypool.toml");
    std::fs::write(&path, config_text(2, "state_file = \"\"")).unwrap();
    let store = Store::open(keypool_store::config::Config::load(&path).unwrap())
        .await
        .unwrap();
    let before = store.config();
    let snapshot = store.snapshot(&before.resolve("acme", "team").unwrap(), now_ms());
    for (i, candidate) in snapshot.iter().enumerate() {
        let account = snapshot
            .account(i, &before)
            .expect("the snapshot's own config");
        assert!(std::sync::Arc::ptr_eq(
            account,
            before.account(candidate.id.as_str()).unwrap()
        ));
    }
    assert!(snapshot.account(snapshot.len(), &before).is_none());
    // another config (a reload between the request and its snapshot): not answered,
    // the caller looks the id up in its own config
    std::fs::write(&path, config_text(2, "state_file = \"\"")).unwrap();
    store.reload(&path).unwrap();
    let after = store.config();
    assert!(!std::sync::Arc::ptr_eq(&before, &after));
    assert!(snapshot.account(0, &after).is_none());
}

/// Each thread has its own copy of the config and its own snapshots: a reload and a
/// disable made on one thread are what every other thread sees next.
#[tokio::test]
async fn every_thread_sees_a_reload_and_a_disable_made_on_another() {
    let dir = TempDir::new("local-views").unwrap();
    let path = dir.path().join("keypool.toml");
    let server = "state_file = \"\"\nsnapshot_ttl_secs = 600";
    std::fs::write(&path, config_text(2, server)).unwrap();
    let store = Store::open(keypool_store::config::Config::load(&path).unwrap())
        .await
        .unwrap();
    let t = now_ms();
    // the other thread takes its copy and a snapshot, then waits for the change
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (seen, report) = std::sync::mpsc::channel();
    let there = store.clone();
    let other = std::thread::spawn(move || {
        let view = |store: &Store| {
            let c = store.config();
            let route = c.resolve("acme", "team").unwrap();
            let snapshot = store.snapshot(&route, t);
            let active: Vec<bool> = snapshot.iter().map(|c| c.active).collect();
            (c.accounts().count(), active, c)
        };
        let before = view(&there);
        seen.send(before.0).unwrap();
        wait.recv().unwrap();
        let after = view(&there);
        (before, after)
    });
    assert_eq!(report.recv().unwrap(), 2);
    let mine = store.config();
    std::fs::write(&path, config_text(3, server)).unwrap();
    store.reload(&path).unwrap();
    assert!(store.disable(&AccountId::from("a0"), "test", t));
    go.send(()).unwrap();
    let ((n0, active0, c0), (n1, active1, c1)) = other.join().unwrap();
    assert_eq!((n0, active0), (2, vec![true, true]));
    assert_eq!(n1, 3, "the reload");
    assert_eq!(active1, [false, true, true], "the disable");
    // each thread's copy is its own, equal in value
    assert!(!std::sync::Arc::ptr_eq(&c0, &mine));
    assert!(!std::sync::Arc::ptr_eq(&c1, &store.config()));
    assert_eq!(store.config().accounts().count(), 3);
}

#[tokio::test]
async fn memory_counters_rotate_per_pool() {
    let store = Store::open(config(&config_text(2, "state_file = \"\"")))
        .await
        .unwrap();
    assert_eq!(store.next_counter("acme/g").await, 0);
    assert_eq!(store.next_counter("acme/g").await, 1);
    assert_eq!(store.next_counter("acme/*").await, 0);
    assert_eq!(store.backend_status().kind, BackendKind::Memory);
    assert!(store.ready());
}

#[tokio::test]
async fn state_file_restart_preserves_a_window_cooldown_with_its_remaining_time() {
    let dir = TempDir::new("statefile").unwrap();
    let file = dir.path().join("state.json");
    let text = config_text(2, &format!("state_file = {:?}", file.display().to_string()));
    let a0 = AccountId::from("a0");
    let now = now_ms();
    let reset = now + 3 * HOUR_MS;
    {
        let store = Store::open(config(&text)).await.unwrap();
        assert!(matches!(
            store.take_boot_state(),
            Some(BootState::StateFile(StateFileLoad::Missing))
        ));
        store.record_failure(&attempt(&a0, now), &window_exhausted(reset), now);
        store.mark_used(&a0, now);
        assert_eq!(store.next_counter("acme/g").await, 0);
        store.persist(now).await.unwrap(); // what shutdown does
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        [std::ffi::OsString::from("state.json")],
        "no temp file left behind"
    );

    let later = now + 60_000;
    let store = Store::open(config(&text)).await.unwrap();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::StateFile(StateFileLoad::Loaded(_)))
    ));
    // the same absolute expiry: 3 h − 1 min left at `later`, not a fresh 60 s
    assert_eq!(
        store.health().cooldowns.cooldown_until(&a0, later),
        Some(reset)
    );
    let c = store.config();
    let snap = store.snapshot(&c.resolve("acme", "team").unwrap(), later);
    assert_eq!(snap.iter().find(|c| c.id == a0).unwrap().last_used, now);
    assert_eq!(store.next_counter("acme/g").await, 1, "counter continues");
}

/// A state file an older keypool wrote after a far-future reset (window and cooldown
/// until `u64::MAX`): loaded at boot, both end within the weekly bound.
#[tokio::test]
async fn a_far_future_reset_in_the_state_file_is_bounded_at_boot() {
    let dir = TempDir::new("farfuture").unwrap();
    let file = dir.path().join("state.json");
    let written = now_ms();
    std::fs::write(
        &file,
        format!(
            r#"{{"version":1,"exported_at":{written},"health":{{"exported_at":{written},"cooldowns":[{}],"disabled":[],"windows":[{}]}},"rating":{{"accounts":[]}},"counters":{{}},"last_used":{{}}}}"#,
            far_future_cooldown_json("a0", written),
            far_future_window_json("a0", written),
        ),
    )
    .unwrap();
    let text = config_text(2, &format!("state_file = {:?}", file.display().to_string()));
    let before = now_ms();
    let store = Store::open(config(&text)).await.unwrap();
    let after = now_ms();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::StateFile(StateFileLoad::Loaded(_)))
    ));
    let a0 = AccountId::from("a0");
    let out = store
        .out_of_window(&a0, after)
        .expect("still out: the bound is in the future");
    assert!(
        (before + WEEKLY_BOUND_MS..=after + WEEKLY_BOUND_MS).contains(&out.until),
        "out until {} (boot at {before}..{after})",
        out.until
    );
    let cooling = store.health().cooldowns.cooldown_until(&a0, after).unwrap();
    assert!(
        (before + WEEKLY_BOUND_MS..=after + WEEKLY_BOUND_MS).contains(&cooling),
        "cooling until {cooling}"
    );
    // back at the bound without any request
    assert_eq!(store.out_of_window(&a0, out.until), None);
    assert_eq!(store.health().cooldowns.cooldown_until(&a0, cooling), None);
}

/// clear-windows is persisted by the state file: after a restart the account is
/// neither out of its window nor cooling for it; a cooldown of another trigger stays.
#[tokio::test]
async fn cleared_windows_stay_cleared_across_a_restart() {
    let dir = TempDir::new("clearwindows").unwrap();
    let file = dir.path().join("state.json");
    let text = config_text(2, &format!("state_file = {:?}", file.display().to_string()));
    let (a0, a1) = (AccountId::from("a0"), AccountId::from("a1"));
    let now = now_ms();
    let reset = now + 3 * HOUR_MS;
    {
        let store = Store::open(config(&text)).await.unwrap();
        for a in [&a0, &a1] {
            store.observe_windows(a, &rejected_until(reset), now);
        }
        store.record_failure(&attempt(&a0, now), &window_exhausted(reset), now);
        store.record_failure(&attempt(&a1, now), &plain_429(), now);
        for a in [&a0, &a1] {
            assert!(store.clear_windows(a).state.is_some());
        }
        store.persist(now).await.unwrap();
    }
    let store = Store::open(config(&text)).await.unwrap();
    for a in [&a0, &a1] {
        assert_eq!(store.out_of_window(a, now), None, "{a}");
    }
    assert_eq!(store.health().cooldowns.cooldown_until(&a0, now), None);
    assert_eq!(
        store.health().cooldowns.cooldown_until(&a1, now),
        Some(now + 60_000),
        "a plain 429's cooldown is not a window's"
    );
}

#[tokio::test]
async fn corrupt_state_file_is_moved_aside_and_reported_never_deleted() {
    let dir = TempDir::new("corrupt").unwrap();
    let file = dir.path().join("state.json");
    std::fs::write(&file, b"{ this is not json").unwrap();
    let text = config_text(1, &format!("state_file = {:?}", file.display().to_string()));
    let store = Store::open(config(&text)).await.unwrap();
    match store.take_boot_state() {
        Some(BootState::StateFile(StateFileLoad::Corrupt { moved_to, reason })) => {
            assert!(
                moved_to
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("state.json.corrupt-")
            );
            assert_eq!(std::fs::read(&moved_to).unwrap(), b"{ this is not json");
            assert!(!reason.is_empty());
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!file.exists());
    // the store serves, and its next snapshot writes a good file
    store.persist(now_ms()).await.unwrap();
    let again = Store::open(config(&text)).await.unwrap();
    assert!(matches!(
        again.take_boot_state(),
        Some(BootState::StateFile(StateFileLoad::Loaded(_)))
    ));
}

#[tokio::test]
async fn state_file_of_another_version_is_set_aside_too() {
    let dir = TempDir::new("version").unwrap();
    let file = dir.path().join("state.json");
    std::fs::write(&file, br#"{"version":99,"exported_at":0,"health":{},"rating":{"accounts":[]},"counters":{},"last_used":{}}"#).unwrap();
    let text = config_text(1, &format!("state_file = {:?}", file.display().to_string()));
    let store = Store::open(config(&text)).await.unwrap();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::StateFile(StateFileLoad::Corrupt { .. }))
    ));
}

#[tokio::test]
async fn out_of_window_uses_the_accounts_own_threshold() {
    let text = config_text(2, "state_file = \"\"")
        .replace("secret = \"s1\"", "secret = \"s1\"\nwindow_threshold = 0.5");
    let store = Store::open(config(&text)).await.unwrap();
    let (a0, a1) = (AccountId::from("a0"), AccountId::from("a1"));
    let now = 1_000_000;
    let reset = now + HOUR_MS;
    store.observe_windows(&a0, &five_hour_at(0.6, reset), now);
    store.observe_windows(&a1, &five_hour_at(0.6, reset), now);
    assert_eq!(store.out_of_window(&a0, now), None, "0.6 < default 0.95");
    let out = store.out_of_window(&a1, now).expect("0.6 ≥ its own 0.5");
    assert_eq!(out.until, reset);
    assert_eq!(
        store.out_of_window(&a1, reset),
        None,
        "back at the reset, without a request"
    );
}

#[tokio::test]
async fn the_state_file_is_written_at_the_first_tick_then_every_snapshot_interval() {
    let dir = TempDir::new("interval").unwrap();
    let file = dir.path().join("state.json");
    let text = config_text(
        1,
        &format!(
            "state_file = {:?}\nstate_snapshot_interval_secs = 3600",
            file.display().to_string()
        ),
    );
    let store = Store::open(config(&text)).await.unwrap();
    let t0 = now_ms();
    // at once: a file that cannot be written shows right after boot
    store.maintain(t0).await;
    assert!(file.exists(), "written at the first tick");
    std::fs::remove_file(&file).unwrap();
    store.maintain(t0 + 1_000).await;
    assert!(!file.exists(), "not due yet");
    store.maintain(t0 + 3_600_000).await;
    assert!(file.exists(), "written once the interval has passed");
    std::fs::remove_file(&file).unwrap();
    store.maintain(t0 + 3_600_001).await;
    assert!(!file.exists(), "next one is an interval later");
}

#[tokio::test]
async fn a_state_file_that_cannot_be_written_is_reported_until_a_write_succeeds() {
    let dir = TempDir::new("unwritable").unwrap();
    let folder = dir.path().join("state");
    let file = folder.join("state.json");
    let text = config_text(
        1,
        &format!(
            "state_file = {:?}\nstate_snapshot_interval_secs = 3600",
            file.display().to_string()
        ),
    );
    // the folder is a regular file: no write succeeds, not even as root. (The store's
    // own maintenance task runs only while this single-threaded test awaits, after
    // `persist` moved the snapshot clock: it writes nothing here.)
    std::fs::write(&folder, b"not a folder").unwrap();
    let store = Store::open(config(&text)).await.unwrap();
    let status = store.backend_status();
    assert_eq!(
        (status.state_file_error, status.state_file_write_failures),
        (None, 0)
    );
    let error = store.persist(now_ms()).await.unwrap_err();
    assert!(
        matches!(error, keypool_store::StoreError::WriteState { .. }),
        "{error}"
    );
    let status = store.backend_status();
    let reported = status.state_file_error.expect("the failure is reported");
    assert!(reported.contains(&file.display().to_string()), "{reported}");
    assert!(reported.contains("Not a directory"), "{reported}");
    assert_eq!(status.state_file_write_failures, 1);
    assert!(store.ready(), "keypool still serves (from memory)");
    // fixed: the next write succeeds and clears the report (the count stays)
    std::fs::remove_file(&folder).unwrap();
    std::fs::create_dir(&folder).unwrap();
    store.persist(now_ms()).await.unwrap();
    let status = store.backend_status();
    assert_eq!(
        (status.state_file_error, status.state_file_write_failures),
        (None, 1)
    );
    assert!(file.exists());
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn snapshot_is_always_sorted_by_priority_last_used_id(
            uses in proptest::collection::vec((0usize..6, 0u64..1_000), 0..20),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let store = rt.block_on(Store::open(config(&config_text(6, "state_file = \"\"\nsnapshot_ttl_secs = 0")))).unwrap();
            for (i, at) in &uses {
                store.mark_used(&AccountId::from(format!("a{i}")), *at);
            }
            let c = store.config();
            let snap = store.snapshot(&c.resolve("acme", "team").unwrap(), 10_000);
            prop_assert_eq!(snap.len(), 6);
            for pair in snap.windows(2) {
                let key = |c: &keypool_selector::Candidate| (c.priority, c.last_used, c.id.clone());
                prop_assert!(key(&pair[0]) < key(&pair[1]));
            }
            for c in snap.iter() {
                let last = uses.iter().filter(|(i, _)| format!("a{i}") == c.id.as_str()).map(|(_, at)| *at).max().unwrap_or(0);
                prop_assert_eq!(c.last_used, last);
            }
        }
    }
}

#[tokio::test]
async fn snapshot_signals_follow_the_candidates_they_sit_beside() {
    let store = memory_store(4, 15).await;
    let c = store.config();
    let route = c.resolve("acme", "team").unwrap();
    let t = 1_000_000;
    store.mark_used(&AccountId::from("a0"), t - 10);
    // Taken before any failure: the signals are live, not a copy.
    let snapshot = store.snapshot(&route, t);
    assert_eq!(ids(&snapshot), ["a1", "a0", "a2", "a3"]);
    assert_eq!(snapshot.signals().len(), snapshot.len());
    let a2 = AccountId::from("a2");
    let rate_limited = Classification {
        class: FailureClass::RateLimit,
        trigger: Trigger::RetryAfter { wait_ms: 30_000 },
    };
    let attempt = keypool_cooldown::Attempt {
        account: &a2,
        base_url: "",
        started_at: t,
        snapshot_len: 4,
        model: "claude-sonnet-4-5",
    };
    store.record_failure(&attempt, &rate_limited, t);
    let cooling: Vec<bool> = snapshot
        .signals()
        .iter()
        .map(|s| s.cooldown.may_block(t))
        .collect();
    assert_eq!(cooling, [false, false, true, false]);
    store.clear_cooldown(&a2);
    assert!(!snapshot.signals()[2].cooldown.may_block(t));
}

#[tokio::test]
async fn kept_survivors_hold_only_for_their_epoch_and_until_a_block_ends() {
    let store = memory_store(3, 15).await;
    let c = store.config();
    let route = c.resolve("acme", "team").unwrap();
    let t = 1_000_000;
    let snapshot = store.snapshot(&route, t);
    assert_eq!(snapshot.kept_survivors(0, 0, t), None);
    let kept = std::sync::Arc::new(keypool_store::KeptSurvivors {
        epoch: 7,
        valid_until: t + 500,
        survivors: vec![0, 2].into(),
    });
    snapshot.keep_survivors(0, kept.clone());
    // Shared by the clones the cache hands out.
    let again = store.snapshot(&route, t + 1);
    assert_eq!(again.kept_survivors(0, 7, t + 499), Some(kept.clone()));
    assert_eq!(again.kept_survivors(0, 8, t + 1), None, "a signal changed");
    assert_eq!(
        again.kept_survivors(0, 7, t + 500),
        None,
        "a block they saw has ended"
    );
    // Each model family has its own list (SPEC 16: a family's window filters apart).
    let opus = keypool_store::survivor_scope(Some(keypool_core::ModelFamily::Opus));
    assert_eq!(again.kept_survivors(opus, 7, t + 1), None);
    let only_one = std::sync::Arc::new(keypool_store::KeptSurvivors {
        survivors: vec![2].into(),
        ..(*kept).clone()
    });
    again.keep_survivors(opus, only_one.clone());
    assert_eq!(again.kept_survivors(opus, 7, t + 1), Some(only_one));
    assert_eq!(again.kept_survivors(0, 7, t + 1), Some(kept));
    assert_eq!(
        again.kept_survivors(keypool_store::SURVIVOR_SCOPES, 7, t + 1),
        None
    );
}

/// SPEC 14: tokens a refresh rotated survive a restart (the state file, owner-only),
/// as long as the config still names the refresh token they grew from; a new login
/// put in the config wins over them.
#[tokio::test]
async fn rotated_oauth_tokens_survive_a_restart_unless_the_config_has_a_new_login() {
    let dir = TempDir::new("oauth-restart").unwrap();
    let state = dir.path().join("state.json");
    let text = |refresh: &str| {
        format!(
            "[server]\nstate_file = {:?}\n\n[[orgs]]\nslug = \"acme\"\n\n[[accounts]]\nid = \"max\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"oauth\"\nsecret = \"sk-ant-oat01-FIRST\"\nrefresh_token = \"{refresh}\"\nexpires_at = 1798761599\n",
            state.display().to_string()
        )
    };
    let id = AccountId::from("max");
    let store = Store::open(config(&text("sk-ant-ort01-SEED")))
        .await
        .unwrap();
    let seeded = store.oauth_tokens().current(&id).unwrap();
    assert_eq!(seeded.access.expose(), "sk-ant-oat01-FIRST");
    store.oauth_tokens().refreshed(
        &id,
        keypool_store::oauth::Tokens {
            access: keypool_store::config::Secret::new("sk-ant-oat01-ROTATED"),
            refresh: keypool_store::config::Secret::new("sk-ant-ort01-ROTATED"),
            expires_at_ms: Some(1_900_000_000_000),
        },
    );
    store.persist(now_ms()).await.unwrap();
    drop(store);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the state file holds tokens: owner only"
        );
    }
    let again = Store::open(config(&text("sk-ant-ort01-SEED")))
        .await
        .unwrap();
    let restored = again.oauth_tokens().current(&id).unwrap();
    assert_eq!(restored.access.expose(), "sk-ant-oat01-ROTATED");
    assert_eq!(restored.refresh.expose(), "sk-ant-ort01-ROTATED");
    assert_eq!(restored.expires_at_ms, Some(1_900_000_000_000));
    drop(again);
    let relogged = Store::open(config(&text("sk-ant-ort01-NEW-LOGIN")))
        .await
        .unwrap();
    let fresh = relogged.oauth_tokens().current(&id).unwrap();
    assert_eq!(fresh.refresh.expose(), "sk-ant-ort01-NEW-LOGIN");
    assert_eq!(fresh.access.expose(), "sk-ant-oat01-FIRST");
}
