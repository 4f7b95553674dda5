//! The store's share of one request: route resolution plus key validation, and the
//! pool snapshot (cached, and rebuilt with `snapshot_ttl_secs = 0`), for a pool of 400.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use keypool_store::config::Config;
use keypool_store::keys::hash_key;
use keypool_store::{Store, now_ms};

const KEY: &str = "sk-lb-benchmarkkey0123456789abcdefghijklmnop";

/// One org with `n` accounts (priorities 0–2) in a group, a URL on it, one key.
fn config(n: usize, snapshot_ttl_secs: u64) -> Config {
    let mut s = format!(
        "[server]\nstate_file = \"\"\nsnapshot_ttl_secs = {snapshot_ttl_secs}\n[[orgs]]\nslug = \"acme\"\n"
    );
    for i in 0..n {
        s += &format!(
            "[[accounts]]\nid = \"acct-{i:04}\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"s\"\npriority = {}\n",
            i % 3
        );
    }
    let ids: Vec<String> = (0..n).map(|i| format!("\"acct-{i:04}\"")).collect();
    s += &format!(
        "[[groups]]\nid = \"g\"\norg = \"acme\"\naccounts = [{}]\n",
        ids.join(",")
    );
    s += "[[urls]]\ncustom_url = \"team\"\norg = \"acme\"\ngroup = \"g\"\n";
    s += &format!(
        "[[keys]]\nid = \"k\"\norg = \"acme\"\nkind = \"user\"\nsha256 = \"{}\"\nurls = [\"*\"]\n",
        hash_key(KEY).to_hex()
    );
    Config::from_toml_str(&s, None, &|_| None).expect("valid bench config")
}

fn request_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let now = now_ms();

    let config = config(400, 15);
    c.bench_function("resolve_and_authenticate", |b| {
        b.iter(|| {
            let route = config
                .resolve(black_box("acme"), black_box("team"))
                .expect("route");
            black_box(
                config
                    .authenticate(&route, Some(black_box(KEY)))
                    .expect("caller"),
            )
        })
    });

    for (name, ttl) in [("snapshot_400_cached", 15), ("snapshot_400_rebuilt", 0)] {
        let store = rt
            .block_on(Store::open(self::config(400, ttl)))
            .expect("store");
        let cfg = store.config();
        let route = cfg.resolve("acme", "team").expect("route");
        c.bench_function(name, |b| b.iter(|| black_box(store.snapshot(&route, now))));
    }
}

criterion_group!(benches, request_path);
criterion_main!(benches);
