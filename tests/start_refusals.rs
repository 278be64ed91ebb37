//! Starts that must not happen, and say why: a configuration with a line at fault, a damaged key
//! store, a data directory another gateway holds, an address that cannot be bound or is named
//! twice. Through the real binary.

mod common;

use common::cli;

#[test]
fn check_config_names_the_line_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, _) = cli(&["check-config", common::shipped_config().to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.ends_with(": ok\n"));
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[gateway]\nlisten = \"127.0.0.1:8080\"\n\n[gateway.plans.free]\nper_minute = -5\nper_day = 10\n").unwrap();
    let (code, _, err) = cli(&["check-config", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("line 5"), "{err}");
    std::fs::write(&bad, "[gateway]\nlisten = \"127.0.0.1:8080\"\nthreds = 2\n").unwrap();
    let (code, _, err) = cli(&["check-config", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("line 3") && err.contains("threds"), "{err}");
    std::fs::write(
        &bad,
        "[[gateway.routes]]\nprefix = \"/v1/orders\"\nupstream = \"somewhere\"\n",
    )
    .unwrap();
    let (code, _, err) = cli(&["check-config", bad.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("gateway.routes[0].upstream"), "{err}");
}

#[test]
fn a_default_configuration_not_found_says_where_it_was_looked_for_and_the_flag() {
    // Run outside the repository, the default `config/animal-store.toml` is not there: the
    // error says the working directory it was read from and how to name the file.
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().canonicalize().unwrap();
    for args in [&["keys", "list"][..], &["serve"], &["check-config"]] {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .current_dir(&here)
            .env_remove(common::REDIS_URL_ENV)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("cannot read config/animal-store.toml: ")
                && err.contains(&format!(
                    "here {}: name the file with --config FILE",
                    here.display()
                )),
            "{args:?}: {err}"
        );
    }
    assert!(
        !here.join("data").exists(),
        "a start without its configuration made nothing"
    );
    // An absolute path needs no hint.
    let missing = here.join("missing.toml");
    let (code, _, err) = cli(&["check-config", missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read") && !err.contains("--config"),
        "{err}"
    );
}

#[test]
fn a_damaged_key_store_stops_the_gateway_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("keys.json"), "{broken").unwrap();
    for command in ["gateway", "serve"] {
        let (code, _, err) = cli(&[
            command,
            "--config",
            common::shipped_config().to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            &common::free_addr().to_string(),
            "--admin-listen",
            &common::free_addr().to_string(),
            "--backend-listen",
            &common::free_addr().to_string(),
        ]);
        assert_eq!(code, 1, "{command}: {err}");
        assert!(err.contains("keys.json is damaged"), "{command}: {err}");
    }
}

/// Runs `animal-store ARGS`, which should fail at start: its exit code and stderr. A process
/// still running after 30 s fails the test instead of hanging it.
fn start_fails(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut proc = common::Proc::start(args, dir.path().join("stderr"));
    let code = proc.wait_exit("a start that should fail");
    (code, proc.log_text())
}

#[test]
fn a_second_gateway_on_one_data_directory_is_refused_until_the_first_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::shipped_config();
    let backend = common::free_addr();
    let mut first = common::GatewayOnly::start(dir.path(), "a", &config, backend, &[]);
    let (listen, admin) = (
        common::free_addr().to_string(),
        common::free_addr().to_string(),
    );
    let (code, err) = start_fails(&[
        "gateway",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        first.data_dir.to_str().unwrap(),
        "--listen",
        &listen,
        "--admin-listen",
        &admin,
        "--backend-listen",
        &backend.to_string(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    let holder = format!(
        "is in use by another gateway (process {})",
        first.proc.child.id()
    );
    assert!(err.contains(&holder), "{err}");
    assert!(err.contains("--redis-url"), "{err}");
    // The first still serves, and once it has stopped, the directory is free again.
    let (status, _, _) = common::raw_http(
        first.listen,
        b"GET /v1/pets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 401);
    assert_eq!(first.proc.terminate(), Some(0));
    let mut again = common::GatewayOnly::start(dir.path(), "a", &config, backend, &[]);
    assert_eq!(again.proc.terminate(), Some(0));
}

#[test]
fn an_address_that_cannot_be_bound_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::shipped_config();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let (listen, admin, backend) = (
        common::free_addr().to_string(),
        common::free_addr().to_string(),
        common::free_addr().to_string(),
    );
    let cases = [
        ("gateway", &taken, &admin, "--listen", &taken),
        ("serve", &listen, &taken, "--admin-listen", &taken),
    ];
    for (command, listen, admin, flag, address) in cases {
        let (code, err) = start_fails(&[
            command,
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            listen,
            "--admin-listen",
            admin,
            "--backend-listen",
            &backend,
        ]);
        assert_eq!(code, Some(1), "{command}: {err}");
        assert!(
            err.contains(&format!("cannot listen on {address} ({flag})")),
            "{command}: {err}"
        );
        assert!(err.contains("in use"), "{command}: {err}");
        assert!(!err.contains("panicked"), "{command}: {err}");
    }
    // Two settings naming one address: refused before anything binds, by `check-config` too,
    // and so is a gateway listening where it forwards the pets.
    let (config, data) = (config.to_str().unwrap(), data.to_str().unwrap());
    let clashes = [
        (
            ["--admin-listen", &listen, "--backend-listen", &backend],
            format!("gateway.admin_listen (--admin-listen): {listen} is taken by gateway.listen"),
        ),
        (
            ["--admin-listen", &admin, "--backend-listen", &listen],
            format!("backend.listen (--backend-listen): {listen} is taken by gateway.listen"),
        ),
    ];
    for (flags, says) in &clashes {
        let mut args = vec!["gateway", "--config", config, "--data-dir", data];
        args.extend(["--listen", &listen]);
        args.extend(flags);
        let (code, err) = start_fails(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(says.as_str()), "{err}");
        args[0] = "check-config";
        let (code, _, err) = common::cli(&args);
        assert_eq!(code, 1, "check-config: {err}");
        assert!(err.contains(says.as_str()), "check-config: {err}");
    }
    // What counts is the configuration a start runs: a file whose listener takes the admin
    // port's default is fine with the admin listener moved by its flag.
    let moved = dir.path().join("moved.toml");
    std::fs::write(&moved, "[gateway]\nlisten = \"127.0.0.1:9090\"\n").unwrap();
    let moved = moved.to_str().unwrap();
    let (code, _, err) = common::cli(&["check-config", moved]);
    assert_eq!(code, 1);
    assert!(
        err.contains("127.0.0.1:9090 is taken by gateway.listen"),
        "{err}"
    );
    let (code, out, err) = common::cli(&["check-config", moved, "--admin-listen", &admin]);
    assert_eq!(code, 0, "{err}");
    assert!(out.ends_with(": ok\n"), "{out}");
    // `serve`'s first start issues a key only if it can listen: else the key would be shown
    // once, by a start that failed, and never again.
    let (code, list, err) = common::cli(&[
        "keys",
        "list",
        "--json",
        "--config",
        config,
        "--data-dir",
        data,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(list.trim(), "[]", "no key issued by a start that failed");
}
