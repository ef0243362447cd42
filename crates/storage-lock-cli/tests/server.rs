//! `storage-lock serve` and `storage-lock token` end to end: the README's curl session works as
//! written, a non-loopback listener needs auth, a token from `token` is accepted by `serve
//! --auth`, SIGTERM stops the server cleanly.

mod support;

use std::process::Command;

use support::{BIN, Served};

/// The lines of the README's curl session (`\` continuations joined), each with the
/// `# …` answer that follows it.
fn readme_session() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let block = readme
        .split("<!-- curl-session")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("\n```").next())
        .expect("the README has the curl session block");
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut command = String::new();
    for line in block.lines() {
        if let Some(answer) = line.strip_prefix("# ") {
            if let Some(last) = steps.last_mut() {
                last.1 = answer.to_owned();
            }
        } else if line.starts_with("curl") || !command.is_empty() {
            command.push_str(line.trim_end_matches('\\'));
            if !line.ends_with('\\') {
                steps.push((std::mem::take(&mut command), String::new()));
            }
        }
    }
    steps
}

/// `run NAME -- sh -c 'echo token=$STORAGE_LOCK_FENCING_TOKEN'` through `url` succeeds and
/// its command sees fencing token 1 (a fresh name).
fn run_sees_token_1(dir: &std::path::Path, url: &str, name: &str) {
    let out = support::cli(
        dir,
        url,
        &[
            "run",
            name,
            "--",
            "sh",
            "-c",
            "echo token=$STORAGE_LOCK_FENCING_TOKEN",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("token=1"));
}

/// The secret `storage-lock token` printed on stderr (the last word of its one line).
fn secret_of(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    assert_eq!(text.lines().count(), 1, "{text}");
    text.split_whitespace().last().unwrap().to_owned()
}

/// `actual` matches `expected` where every `…` in `expected` stands for any text.
fn matches(expected: &str, actual: &str) -> bool {
    let mut rest = actual;
    let mut parts = expected.split('…').peekable();
    let first = parts.next().unwrap_or("");
    let Some(after) = rest.strip_prefix(first) else {
        return false;
    };
    rest = after;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

#[test]
fn readme_curl_session_works_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let server = Served::start(&format!("sqlite://{}/locks.db", dir.path().display()), &[]);
    let host = server.url.trim_start_matches("http://");
    let steps = readme_session();
    assert_eq!(steps.len(), 3, "acquire, renew, release: {steps:?}");
    for (command, answer) in steps {
        let command = command.replace("localhost:7420", host);
        let out = Command::new("bash")
            .args(["-c", &command])
            .output()
            .unwrap();
        assert!(out.status.success(), "{command}");
        let got = String::from_utf8_lossy(&out.stdout);
        assert!(
            matches(&answer, got.trim()),
            "{command}\nwant {answer}\ngot  {got}"
        );
    }
}

#[test]
fn serve_refuses_a_public_address_without_auth() {
    let out = Command::new(BIN)
        .args([
            "--storage",
            "memory:",
            "-q",
            "serve",
            "--listen",
            "0.0.0.0:0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("--auth"), "{err}");
}

#[test]
fn a_token_from_token_is_accepted_by_serve_auth() {
    let out = Command::new(BIN)
        .args(["token", "ci", "--prefix", "ci/", "--allow", "lock"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let secret = secret_of(&out.stderr);
    assert!(
        !text.contains(&secret),
        "the secret is in the entry: {text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, &text).unwrap();
    let server = Served::start("memory:", &["--auth", auth.to_str().unwrap()]);
    let status = |token: &str, name: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-H", "content-type: application/json"])
            .args(["-H", &format!("authorization: Bearer {token}")])
            .args(["-d", r#"{"lease_ms": 1000}"#])
            .arg(format!("{}/v1/locks/{name}/acquire", server.url))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(status(&secret, "ci%2Fbuild"), "200");
    assert_eq!(status(&secret, "prod%2Fdeploy"), "403");
    assert_eq!(status("wrong", "ci%2Fbuild"), "401");
    // The CLI through it: a refused token or a missing grant is exit 77 (not allowed), never
    // 69 (storage unavailable, which a wrapper would retry) or 78.
    let cli = |token: &str, name: &str| {
        Command::new(BIN)
            .args(["--storage", &format!("{}?token={token}", server.url)])
            .args(["acquire", name, "--no-wait"])
            .env_remove("STORAGE_LOCK_URL")
            .env("HOME", dir.path())
            .output()
            .unwrap()
    };
    let ok = cli(&secret, "ci/cli");
    assert!(ok.status.success(), "{ok:?}");
    for (token, name, why) in [
        (secret.as_str(), "prod/cli", "403"),
        ("wrong", "ci/cli2", "401"),
    ] {
        let out = cli(token, name);
        assert_eq!(out.status.code(), Some(77), "{why}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not allowed"), "{why}: {stderr}");
        assert!(
            !stderr.contains(&secret),
            "{why}: the secret leaked: {stderr}"
        );
    }
}

/// `serve` answers on a worker thread per core, and `TOKIO_WORKER_THREADS` sets how many (the
/// README says so); it ran every request on one thread.
#[test]
fn serve_runs_the_workers_tokio_worker_threads_asks_for() {
    let served = Served::start_with_env("memory:", &[], &[("TOKIO_WORKER_THREADS", "3")]);
    let workers = || {
        std::fs::read_dir(format!("/proc/{}/task", served.pid()))
            .expect("/proc")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == "serve-worker")
            .count()
    };
    // A new thread names itself once it runs: wait for the names, not for a time.
    let started = std::time::Instant::now();
    while workers() < 3 && started.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(workers(), 3, "worker threads of the server");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut server = Served::start("memory:", &[]);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = server.wait_within(std::time::Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{status}");
}

/// The CLI works against a server unchanged: `--storage http://…` for run, acquire, renew,
/// release, list and inspect; two contending `run`s take turns.
#[test]
fn the_cli_works_against_a_server() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = Served::start(&format!("sqlite://{}/locks.db", dir.path().display()), &[]);
    let url = server.url.as_str();
    run_sees_token_1(dir.path(), url, "cli/run");
    let out = support::cli(
        dir.path(),
        url,
        &["acquire", "cli/script", "--lease", "30s"],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(support::is_held(dir.path(), url, "cli/script"));
    // `check` judges the storage behind the server (its `GET /v1/storage`).
    let check = support::cli(dir.path(), url, &["check", "--json"])
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    let v: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["backend"], "remote", "{v}");
    assert_eq!(v["server_storage"], "sqlite", "{v}");
    assert_eq!(v["durability"], "durable", "{v}");
    assert_eq!(v["verdict"], "ok", "{v}");
    let list = support::cli(dir.path(), url, &["list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("cli/script"));
    assert!(
        support::cli(dir.path(), url, &["renew", &token])
            .status()
            .unwrap()
            .success()
    );
    assert!(
        support::cli(dir.path(), url, &["release", &token])
            .status()
            .unwrap()
            .success()
    );
    assert!(!support::is_held(dir.path(), url, "cli/script"));
    let again = support::cli(dir.path(), url, &["release", &token])
        .status()
        .unwrap();
    assert_eq!(again.code(), Some(76), "no longer held");
    // Two runs on one lock take turns through the server.
    let slow = |_| {
        support::cli(
            dir.path(),
            url,
            &["run", "-w", "20", "cli/turns", "--", "sleep", "0.5"],
        )
        .spawn()
        .unwrap()
    };
    let started = std::time::Instant::now();
    let mut a = slow(0);
    let mut b = slow(1);
    assert!(support::wait_within(&mut a, Duration::from_secs(20)).success());
    assert!(support::wait_within(&mut b, Duration::from_secs(20)).success());
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "they took turns"
    );
    // A shared run works through the server too (its server keeps the readers' limit record;
    // run.rs checks -s against -x through a server).
    let shared = support::output_within(
        &mut support::cli(dir.path(), url, &["run", "-s", "cli/turns", "--", "true"]),
        Duration::from_secs(20),
    );
    assert_eq!(shared.status.code(), Some(0), "{shared:?}");
}

/// `serve --tls-cert --tls-key --tls-client-ca`: the CLI runs through it over `https://` with
/// the CA and a client certificate in the URL, and is refused without the client certificate,
/// without the CA, and over plain `http://` (certificates made at test time).
#[test]
fn serve_over_mutual_tls_and_the_cli_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    storage_lock_testkit::tls::make_certificates(d);
    let p = |f: &str| d.join(f).display().to_string();
    let server = Served::start(
        &format!("sqlite://{}/locks.db", d.display()),
        &[
            "--tls-cert",
            &p("server.pem"),
            "--tls-key",
            &p("server.key"),
            "--tls-client-ca",
            &p("ca.pem"),
        ],
    );
    let base = server.url.clone();
    assert!(base.starts_with("https://"), "{base}");
    let url = format!(
        "{base}?ca={}&cert={}&key={}",
        p("ca.pem"),
        p("client.pem"),
        p("client.key")
    );
    run_sees_token_1(d, &url, "tls/run");
    let plain = base.replacen("https://", "http://", 1);
    for refused in [
        format!("{base}?ca={}", p("ca.pem")),
        format!("{base}?cert={}&key={}", p("client.pem"), p("client.key")),
        plain,
    ] {
        let out = support::cli(d, &refused, &["list"]).output().unwrap();
        assert_eq!(out.status.code(), Some(69), "{refused}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{refused}: {stderr}");
    }
    // A bad certificate file: one line, exit 78 (configuration), nothing served.
    let out = Command::new(BIN)
        .args(["--storage", "memory:", "serve", "--listen", "127.0.0.1:0"])
        .args([
            "--tls-cert",
            &p("missing.pem"),
            "--tls-key",
            &p("server.key"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.pem"));
}

/// `break`, `sweep` and `inspect` (with the fencing floor) work through a server with an admin
/// token (they exited 69, "remote does not support update"); a token with only `lock` gets
/// 77 (not allowed) and changes nothing.
#[test]
fn admin_commands_work_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut auth_file = String::new();
    let mut secret = |name: &str, allow: &str| {
        let out = Command::new(BIN)
            .args(["token", name, "--prefix", "adm/", "--allow", allow])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        auth_file.push_str(&String::from_utf8(out.stdout).unwrap());
        secret_of(&out.stderr)
    };
    let (locker, admin) = (secret("locker", "lock"), secret("admin", "admin"));
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, &auth_file).unwrap();
    let server = Served::start(
        &format!("sqlite://{}/locks.db", dir.path().display()),
        &["--auth", auth.to_str().unwrap()],
    );
    let as_ = |token: &str| format!("{}?token={token}", server.url);
    let run = |token: &str, args: &[&str]| {
        support::cli(dir.path(), &as_(token), args)
            .output()
            .unwrap()
    };
    let out = run(&locker, &["acquire", "adm/stuck", "--lease", "10m"]);
    assert!(out.status.success(), "{out:?}");
    for args in [
        &["break", "adm/stuck", "--yes"][..],
        &["sweep", "--older-than", "0s", "adm/"][..],
    ] {
        let out = run(&locker, args);
        assert_eq!(out.status.code(), Some(77), "{args:?}: {out:?}");
    }
    assert!(support::is_held(dir.path(), &as_(&admin), "adm/stuck"));
    let out = run(&admin, &["break", "adm/stuck", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!support::is_held(dir.path(), &as_(&admin), "adm/stuck"));
    let out = run(&admin, &["sweep", "--older-than", "0s", "adm/"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("deleted 1 record(s); fencing floor 1"),
        "{said}"
    );
    let info = support::inspect(dir.path(), &as_(&admin), "adm/stuck");
    assert_eq!(info["fencing_floor"], 1, "{info}");
    // Fencing still moves forward after the break and the sweep.
    let out = run(&locker, &["acquire", "adm/stuck", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let info = support::inspect(dir.path(), &as_(&admin), "adm/stuck");
    assert_eq!(info["fencing_token"], 2, "{info}");
}

/// `serve --auth FILE` puts a changed file in force without a restart (on change, and on
/// SIGHUP), and keeps the tokens in force when the new file does not parse; `token
/// --secret-file` writes the secret there (mode 0600) and only the entry to stdout.
#[test]
fn the_auth_file_is_reloaded_on_change_and_on_sighup() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let token = |name: &str| {
        let file = dir.path().join(format!("{name}.secret"));
        let out = Command::new(BIN)
            .args(["token", name, "--secret-file"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(out.stderr.is_empty(), "{out:?}");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let secret = std::fs::read_to_string(&file).unwrap().trim().to_owned();
        (String::from_utf8(out.stdout).unwrap(), secret)
    };
    let auth = dir.path().join("auth.toml");
    // Replaced by a rename, as editors and config managers do.
    let install = |text: &str| {
        let tmp = dir.path().join("auth.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &auth).unwrap();
    };
    let (a_entry, a) = token("a");
    install(&a_entry);
    let server = Served::start("memory:", &["--auth", auth.to_str().unwrap()]);
    let status = |secret: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", &format!("authorization: Bearer {secret}")])
            .arg(format!("{}/v1/locks", server.url))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let eventually = |what: &str, cond: &dyn Fn() -> bool| {
        let give_up = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < give_up, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(status(&a), "200");
    let (b_entry, b) = token("b");
    install(&b_entry);
    eventually("the changed file to be in force", &|| status(&b) == "200");
    assert_eq!(status(&a), "401", "a removed token still works");
    // A broken file: the tokens in force stay (SIGHUP makes it try at once).
    install("[[token]]\nname = 'broken'\n");
    support::kill(server.pid(), nix::sys::signal::Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(status(&b), "200", "a broken file replaced the tokens");
    let (c_entry, c) = token("c");
    install(&c_entry);
    support::kill(server.pid(), nix::sys::signal::Signal::SIGHUP);
    eventually("SIGHUP to load the file", &|| status(&c) == "200");
    assert_eq!(status(&b), "401");
}
