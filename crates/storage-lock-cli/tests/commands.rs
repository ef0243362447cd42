//! `acquire` / `renew` / `release` from a shell script, `list --json`, and bad input, end to end
//! on the real binary.

mod support;

use std::time::Duration;

use support::{BIN, cli, output_within, unique, urls};

const LIMIT: Duration = Duration::from_secs(15);

#[test]
fn acquire_renew_release_round_trip_from_a_shell_script() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let name = unique("script");
        let script = r#"
            set -u
            sl() { "$BIN" --storage "$URL" "$@"; }
            token=$(sl acquire "$NAME" --no-wait --lease 10s) || { echo "acquire failed"; exit 1; }
            sl acquire "$NAME" --no-wait 2>/dev/null; echo "busy=$?"
            sl renew "$token" --lease 20s >/dev/null; echo "renew=$?"
            sl release "$token"; echo "release=$?"
            again=$(sl acquire "$NAME" --no-wait) ; echo "free=$?"
            sl release "$again"
            sl release "$token" 2>/dev/null; echo "release-again=$?"
            sl renew "$token" 2>/dev/null >/dev/null; echo "renew-released=$?"
        "#;
        let out = output_within(
            std::process::Command::new("sh")
                .args(["-c", script])
                .env("BIN", BIN)
                .env("URL", &url)
                .env("NAME", &name)
                .env("HOME", dir.path())
                .stdin(std::process::Stdio::null()),
            LIMIT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{url}: {out:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines,
            [
                "busy=75",
                "renew=0",
                "release=0",
                "free=0",
                "release-again=76",
                "renew-released=76"
            ],
            "{url}: {out:?}"
        );
    }
}

#[test]
fn list_json_shows_a_held_lock() {
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let name = unique("listed");
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &["acquire", &name, "--json", "--note", "nightly build"],
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let acquired: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let token = acquired["token"].as_str().unwrap().to_owned();

        let out = output_within(
            &mut cli(dir.path(), &url, &["list", &name, "--json"]),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = listed.as_array().expect("an array");
        let row = rows
            .iter()
            .find(|r| r["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{url}: {name} not listed: {listed}"));
        assert_eq!(row["held"], true);
        assert_eq!(row["fencing_token"], acquired["fencing_token"]);
        assert_eq!(row["holder"]["note"], "nightly build");
        assert!(row["time_left_ms"].as_u64().unwrap() > 0);
        assert!(
            !listed.to_string().contains(&token[3..35]),
            "{url}: list must not reveal the owner id"
        );

        let out = output_within(&mut cli(dir.path(), &url, &["release", &token]), LIMIT);
        assert!(out.status.success(), "{url}: {out:?}");
        let out = output_within(
            &mut cli(dir.path(), &url, &["list", &name, "--json"]),
            LIMIT,
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "{url}");
    }
}

/// Asserts a failed run: non-zero `code`, exactly one line on stderr, no panic.
/// No wall clock decides expiry: a contender whose wall clock runs an hour ahead (libfaketime;
/// monotonic and boot clocks left alone, as an NTP step would) finds a held lock busy on every
/// backend whose `check` says `clock: storage` (the storage's own clock) or `clock: observed`
/// (etcd, NATS, S3: expiry timed by each client's monotonic clock from its first sight of a
/// version). Where it says `clock: client` the README's drift caveat is what happens, and this
/// test shows it: the skewed contender takes the held lock.
#[test]
fn a_contender_whose_clock_runs_an_hour_ahead_finds_a_held_lock_busy() {
    let dir = tempfile::tempdir().unwrap();
    // libfaketime preloaded as torture's skew fault does (not the `faketime` wrapper, whose
    // leftovers in /dev/shm made it fail at random).
    let lib = storage_lock_cli::commands::torture::libfaketime()
        .expect("libfaketime is missing (scripts/services.sh installs it)");
    let ahead = storage_lock_cli::commands::torture::skewed_clock_env(&lib, "+1h");
    let skewed = |url: &str, args: &[&str]| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["--storage", url])
            .args(args)
            .envs(ahead.clone())
            .env_remove("STORAGE_LOCK_URL")
            .env_remove("RUST_LOG")
            .env("HOME", dir.path())
            .stdin(std::process::Stdio::null());
        cmd
    };
    // The tool works here: the skewed process sees the future.
    let date = output_within(
        std::process::Command::new("date")
            .arg("+%s")
            .envs(ahead.clone()),
        LIMIT,
    );
    assert!(date.status.success(), "{date:?}");
    let ahead: u64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        ahead > now + 3000,
        "faketime did not move the clock: {ahead} vs {now}"
    );
    for url in urls(dir.path()) {
        let name = unique("skew");
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &["acquire", &name, "--no-wait", "--lease", "60s"],
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let check = output_within(&mut cli(dir.path(), &url, &["check", "--json"]), LIMIT);
        let check: serde_json::Value =
            serde_json::from_slice(&check.stdout).unwrap_or_else(|e| panic!("{url}: {e}"));
        let taken = output_within(&mut skewed(&url, &["acquire", &name, "--no-wait"]), LIMIT);
        match check["clock"].as_str() {
            Some("storage" | "observed") => assert_eq!(
                taken.status.code(),
                Some(75),
                "{url}: a contender an hour ahead must find the lock busy: {taken:?}"
            ),
            Some("client") => {
                assert_eq!(
                    taken.status.code(),
                    Some(0),
                    "{url}: on a client clock the README's drift caveat applies: {taken:?}"
                );
                let theirs = String::from_utf8_lossy(&taken.stdout).trim().to_owned();
                output_within(&mut cli(dir.path(), &url, &["release", &theirs]), LIMIT);
            }
            other => panic!("{url}: clock {other:?} in {check}"),
        }
        output_within(&mut cli(dir.path(), &url, &["release", &token]), LIMIT);
    }
}

fn assert_one_line_error(what: &str, out: &std::process::Output, code: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr:?}");
    assert!(
        stderr.starts_with("storage-lock: error: "),
        "{what}: {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr:?}");
}

#[test]
fn bad_input_gets_one_line_and_a_stable_code() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_file = format!("sqlite://{}", dir.path().display());
    let unreadable = "sqlite:///proc/storage-lock-test/locks.db".to_owned();
    for (what, url, code) in [
        ("unknown scheme", "nosuch://host/x".to_owned(), 2),
        ("malformed URL", "sqlite:".to_owned(), 2),
        ("no scheme", "just-a-path".to_owned(), 2),
        ("bad option", "sqlite:///tmp/x.db?colour=red".to_owned(), 2),
        ("unreadable SQLite path", unreadable, 69),
        ("SQLite path is a directory", not_a_file, 69),
        (
            "SQLite directory missing",
            format!("sqlite://{}/missing-dir/x.db", dir.path().display()),
            69,
        ),
        (
            "unreachable PostgreSQL",
            "postgres://postgres@127.0.0.1:1/test".to_owned(),
            69,
        ),
        (
            "unreachable MySQL",
            "mysql://root@127.0.0.1:1/test".to_owned(),
            69,
        ),
        ("unreachable Redis", "redis://127.0.0.1:1/".to_owned(), 69),
    ] {
        let out = output_within(
            &mut cli(dir.path(), &url, &["run", "job", "--", "true"]),
            LIMIT,
        );
        assert_one_line_error(what, &out, code);
        // A server that refuses the connection is named as such at once, not as the pool's
        // "pool timed out" after its 5 s acquire timeout (PostgreSQL and MySQL did that).
        if what.starts_with("unreachable") {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("refused") && !stderr.contains("timed out"),
                "{what}: {stderr}"
            );
        }
    }
    assert!(
        !dir.path().join("missing-dir").exists(),
        "a mistyped SQLite path created a directory"
    );

    for url in urls(dir.path()) {
        let name = unique("bad");
        for (what, args, code) in [
            ("empty name", vec!["run", "", "--", "true"], 2),
            ("blank name", vec!["acquire", "  "], 2),
            (
                "--renew >= --lease",
                vec!["run", &name, "--lease", "1s", "--renew", "1s", "--", "true"],
                2,
            ),
            (
                "bad duration",
                vec!["run", &name, "--lease", "5x", "--", "true"],
                2,
            ),
            ("no command", vec!["run", &name], 2),
            ("malformed token", vec!["release", "v1.nope"], 2),
            (
                "not found",
                vec!["run", &name, "--", "/no/such/command"],
                127,
            ),
        ] {
            let out = output_within(&mut cli(dir.path(), &url, &args), LIMIT);
            assert_one_line_error(&format!("{url}: {what}"), &out, code);
        }
        // Nothing was left held by any of them.
        let out = output_within(
            &mut cli(dir.path(), &url, &["list", &name, "--json"]),
            LIMIT,
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "{url}");
    }
}

/// Small promises of the help text: `run NAME CMD` (flock's syntax) says where the command
/// goes; `acquire -n` on a busy lock is silent (like `flock -n`) unless -v; `acquire --json`
/// says `"acquired": false` on stdout when busy; `--help` lists exit codes 77 and 78, and
/// `serve --help` names gRPC, /ui and /metrics.
#[test]
fn small_promises_of_the_help_text_hold() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let out = output_within(
        &mut cli(dir.path(), &url, &["run", "j", "echo", "hi"]),
        LIMIT,
    );
    assert_one_line_error("run without --", &out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("after `--`"),
        "{out:?}"
    );
    let name = unique("small");
    let held = output_within(&mut cli(dir.path(), &url, &["acquire", &name]), LIMIT);
    assert!(held.status.success(), "{held:?}");
    let busy = output_within(&mut cli(dir.path(), &url, &["acquire", &name, "-n"]), LIMIT);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert!(busy.stderr.is_empty() && busy.stdout.is_empty(), "{busy:?}");
    let loud = output_within(
        &mut cli(dir.path(), &url, &["-v", "acquire", &name, "-n"]),
        LIMIT,
    );
    let notice = String::from_utf8_lossy(&loud.stderr);
    assert!(
        notice.contains("not acquired") && notice.contains("held by") && notice.contains(":"),
        "{loud:?}"
    );
    let json = output_within(
        &mut cli(dir.path(), &url, &["acquire", &name, "-n", "--json"]),
        LIMIT,
    );
    assert_eq!(json.status.code(), Some(75), "{json:?}");
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!(v["acquired"], false, "{v}");
    // The holder as the busy answer named it (the first acquire's script holder).
    assert!(v["holder"].as_str().is_some_and(|h| h.contains(':')), "{v}");
    assert!(v["lease_left_ms"].as_u64().is_some_and(|ms| ms > 0), "{v}");
    let help = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for code in ["  77 ", "  78 "] {
        assert!(help.contains(code), "--help lacks exit code{code}");
    }
    let serve = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let serve = String::from_utf8_lossy(&serve.stdout);
    for what in ["gRPC", "/ui", "/metrics", "--tls-cert"] {
        assert!(serve.contains(what), "serve --help lacks {what}");
    }
}

/// `elect` runs its command only as leader, with the term in `STORAGE_LOCK_FENCING_TOKEN` and
/// its value published; `leader` reports the seat (exit 0) or a vacancy (exit 1), and
/// `leader --watch` follows the seat in term order; bad values are usage errors.
#[test]
fn elect_runs_the_command_as_leader_and_leader_follows_the_seat() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    for url in urls(dir.path()) {
        let name = unique("elect");
        let out = output_within(&mut cli(dir.path(), &url, &["leader", &name]), LIMIT);
        assert_eq!(out.status.code(), Some(1), "{url}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "vacant");

        // A follower of the seat, from before the first leader.
        let mut watcher = Reaped(
            cli(dir.path(), &url, &["leader", &name, "--watch", "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let (tx, seen) = std::sync::mpsc::channel::<serde_json::Value>();
        let stdout = watcher.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).expect("a JSON line"));
            }
        });
        let next = || {
            seen.recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("{url}: no watch line: {e}"))
        };
        assert_eq!(next()["leader"], serde_json::Value::Null, "{url}");

        let term_file = dir.path().join(format!("{name}.term"));
        let stop = dir.path().join(format!("{name}.stop"));
        let script = format!(
            "echo $STORAGE_LOCK_FENCING_TOKEN > '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
            term_file.display(),
            stop.display()
        );
        let mut leader = Reaped(
            cli(
                dir.path(),
                &url,
                &["elect", &name, "--value", "node-a", "-c", &script],
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
        );
        support::wait_until(LIMIT, "the leader's command started", || {
            std::fs::read_to_string(&term_file).is_ok_and(|t| t.ends_with('\n'))
        });
        let term = std::fs::read_to_string(&term_file)
            .unwrap()
            .trim()
            .to_owned();
        let out = output_within(
            &mut cli(dir.path(), &url, &["leader", &name, "--json"]),
            LIMIT,
        );
        assert!(out.status.success(), "{url}: {out:?}");
        let seat: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(seat["leader"], "node-a", "{url}");
        assert_eq!(seat["term"], term.as_str(), "{url}");
        let watched = next();
        assert_eq!(
            (&watched["leader"], &watched["term"]),
            (&serde_json::json!("node-a"), &serde_json::json!(term)),
            "{url}"
        );
        // The seat is taken: a candidate that does not wait is refused (75), its command unrun.
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &["elect", &name, "-n", "--value", "node-b", "--", "false"],
            ),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(75), "{url}: {out:?}");
        std::fs::write(&stop, "").unwrap();
        assert!(
            support::wait_within(&mut leader.0, LIMIT).success(),
            "{url}"
        );
        let vacant = next();
        assert_eq!(vacant["leader"], serde_json::Value::Null, "{url}");
        assert_eq!(
            vacant["term"],
            term.as_str(),
            "{url}: the vacancy follows term {term}"
        );
        let out = output_within(&mut cli(dir.path(), &url, &["leader", &name]), LIMIT);
        assert_eq!(out.status.code(), Some(1), "{url}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("vacant (after term {term})")
        );
        drop(watcher);

        for bad in [
            &["elect", &name, "--value", "two\nlines", "--", "true"][..],
            &["elect", &name, "--value", "a", "--note", "b", "--", "true"][..],
        ] {
            let out = output_within(&mut cli(dir.path(), &url, bad), LIMIT);
            assert_eq!(out.status.code(), Some(2), "{url}: {bad:?}: {out:?}");
            assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
        }
    }
}

/// A child process killed and reaped when the test ends, a panic included.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
