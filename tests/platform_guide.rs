//! The README's platform guide, run as written: two instances of `examples/orders.rs`, the
//! guide's route (taken from the README itself) added to a running gateway by SIGHUP.

mod common;

use std::process::{Command, Stdio};

use common::{Stack, cli, client, free_addr, wait_for_port};
use nix::sys::signal::{Signal, kill};
use serde_json::Value;

/// The TOML block after `<!-- guide:route -->` in the README, unindented.
fn guide_route() -> String {
    let readme = include_str!("../README.md");
    let after = readme
        .split("<!-- guide:route -->")
        .nth(1)
        .expect("the guide's marker");
    let block = after
        .split("```toml")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    block
        .lines()
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Besides `CARGO_PKG_*`, what cargo sets for a test's run that describes the test's package.
const RUN_BY_CARGO: [&str; 6] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "OUT_DIR",
];

/// The orders example, built as the test binaries are. `cargo test --workspace` has built it
/// already; `cargo test --test platform_guide` builds no example, so the test asks cargo for it
/// (a no-op when it is fresh), in the test's own target directory and profile.
fn orders_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile dir>/deps/<test binary>
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev",
        other => other,
    };
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        // The workspace's features, as `cargo test --workspace` built it: there, nothing to do.
        .args(["build", "--quiet", "--workspace", "--example", "orders"])
        .args(["--profile", profile])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap());
    // What cargo set for this test's run describes this package, not the build asked for: left
    // in, some of it changes the fingerprints of crates that read it, and both builds, this and
    // the next `cargo test`, would compile them again.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_") || RUN_BY_CARGO.contains(&name.as_ref()) {
            cargo.env_remove(name.as_ref());
        }
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "cargo build --example orders: {status}");
    profile_dir.join("examples/orders")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_platform_guide_adds_a_pooled_service_to_a_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (free_addr(), free_addr());
    let mut orders = Command::new(orders_binary())
        .args([one.to_string(), two.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("the orders example starts");
    wait_for_port(one, &mut orders);
    wait_for_port(two, &mut orders);

    let config = dir.path().join("animal-store.toml");
    std::fs::copy(common::shipped_config(), &config).unwrap();
    let stack = Stack::start_with(dir.path(), &config);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = stack.get(&c, "/v1/store/orders/7", &key).await;
    assert_eq!(r.status(), 404, "not routed yet");

    // Step 2 and 3: the guide's route, the file checked, SIGHUP.
    let route = guide_route()
        .replace("127.0.0.1:9101", &one.to_string())
        .replace("127.0.0.1:9102", &two.to_string());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&route);
    std::fs::write(&config, text).unwrap();
    let (code, out, err) = cli(&["check-config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");

    // Step 4: balanced over both, the caller named, the deprecated operation marked.
    let mut instances = std::collections::HashSet::new();
    for _ in 0..4 {
        let r = stack.get(&c, "/v1/store/orders/7", &key).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("deprecation") && r.headers().contains_key("sunset"));
        assert!(r.headers().contains_key("x-ratelimit-remaining"));
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["key_id"], common::key_id(&key));
        instances.insert(body["instance"].as_str().unwrap().to_owned());
    }
    assert_eq!(instances.len(), 2, "both instances served: {instances:?}");
    let r = stack.get(&c, "/v1/store/orders", &key).await;
    assert_eq!(r.status(), 200);
    assert!(
        !r.headers().contains_key("deprecation"),
        "only the deprecated operation"
    );
    let _ = orders.kill();
    let _ = orders.wait();
}
