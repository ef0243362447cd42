//! `storage-lock run` is never outlived by its command: killed or stopped supervisor, lost lock,
//! a command that ignores SIGTERM, processes the command leaves behind, signals, terminals.
//! The real binary, real processes, every storage of `support::urls`.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{
    BIN, Scratch, alive, cli, file, inspect, kill, now_ns, output_within, read, stamps, unique,
    urls, wait_until, wait_within, writer_script, writer_started,
};

const LIMIT: Duration = Duration::from_secs(20);

/// Runs a second `run NAME --wait 10s` that records when its command started (ns).
fn second_holder(dir: &Scratch, url: &str, name: &str) -> u128 {
    let s = file(dir.path(), "second");
    let out = output_within(
        cli(
            dir.path(),
            url,
            &[
                "run",
                name,
                "--wait",
                "10s",
                "--",
                "sh",
                "-c",
                "date +%s%N > \"$S\"",
            ],
        )
        .env("S", &s),
        LIMIT,
    );
    assert!(out.status.success(), "{url}: second holder: {out:?}");
    read(&s)
        .parse()
        .unwrap_or_else(|_| panic!("{url}: second start"))
}

/// Starts `run NAME MODE --lease LEASE --kill-grace 500ms -- <writer>` (MODE `-x` or `-s`),
/// waits for the writer's first writes, then `kill -9`s `run`: (the writer's file, its pid,
/// when `run` was killed).
fn run_writer_then_kill_9(
    dir: &Scratch,
    url: &str,
    name: &str,
    mode: &str,
    lease: &str,
) -> (std::path::PathBuf, u32, u128) {
    let w = file(dir.path(), "w");
    let mut holder = cli(
        dir.path(),
        url,
        &[
            "run",
            name,
            mode,
            "--lease",
            lease,
            "--kill-grace",
            "500ms",
            "--",
            "sh",
            "-c",
            &writer_script(false),
        ],
    )
    .env("W", &w)
    .spawn()
    .unwrap();
    let cmd = writer_started(dir.path(), &w);
    kill(holder.id(), Signal::SIGKILL);
    holder.wait().unwrap();
    (w, cmd, now_ns())
}

#[test]
fn kill_9_of_run_stops_its_command_before_anyone_else_gets_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let name = unique("kill9");
        let (w, cmd, killed) = run_writer_then_kill_9(dir, &url, &name, "-x", "2s");
        // The sentinel sends SIGTERM at once.
        wait_until(Duration::from_secs(2), "the command to stop", || {
            !alive(cmd)
        });
        let second = second_holder(dir, &url, &name);
        let last = *stamps(&w).last().unwrap();
        assert!(
            last < second,
            "{url}: the command wrote at {last}, after the next holder started at {second}"
        );
        assert!(
            last < killed + 1_000_000_000,
            "{url}: the command kept writing {} ms after run was killed",
            (last - killed) / 1_000_000
        );
    }
}

/// `kill -9` of `run` frees the lock as soon as its command is stopped, as `flock` does when
/// its holder dies: the sentinel releases the hold. With a 60 s lease, the next holder (which
/// waits 10 s at most) got it only after the lease before.
#[test]
fn kill_9_of_run_frees_the_lock_once_its_command_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let name = unique("kill9free");
        let (w, cmd, killed) = run_writer_then_kill_9(dir, &url, &name, "-x", "60s");
        let second = second_holder(dir, &url, &name);
        let last = *stamps(&w).last().unwrap();
        assert!(!alive(cmd), "{url}: the command outlived run");
        assert!(
            last < second,
            "{url}: the command wrote at {last}, after the next holder started at {second}"
        );
        eprintln!(
            "{url}: next holder {} ms after kill -9",
            (second.saturating_sub(killed)) / 1_000_000
        );
    }
}

/// The same for a shared run (`-s`, a reader slot): `kill -9` of it stops its command, and an
/// exclusive run (which waits 10 s at most, against a 60 s lease) starts only after the
/// command's last write: the sentinel gave the reader slot back.
#[test]
fn kill_9_of_a_shared_run_stops_its_command_and_lets_an_exclusive_run_in() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let name = unique("kill9shared");
        let (w, cmd, _) = run_writer_then_kill_9(dir, &url, &name, "-s", "60s");
        let second = second_holder(dir, &url, &name);
        let last = *stamps(&w).last().unwrap();
        assert!(!alive(cmd), "{url}: the command outlived run -s");
        assert!(
            last < second,
            "{url}: the shared run's command wrote at {last}, after the exclusive run started at {second}"
        );
    }
}

/// How late, at most, this test lets the sentinel's SIGKILL land after the hold's expiry on the
/// storage. The sentinel sends it at the local deadline, 17 ms (the safety margin of a 1.5 s
/// lease) before that expiry; a loaded 2-core machine can wake a process tens of milliseconds
/// late (a clean-clone CI run saw a write 5 ms past the expiry: the SIGKILL came 22 ms late),
/// which no process can prevent. The safety property, that the command never writes once the
/// next holder has started, is checked exactly (`last < second`).
const SCHEDULING_SLACK_MS: u128 = 250;

#[test]
fn a_stopped_run_has_its_command_stopped_by_the_deadline_even_if_it_ignores_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for url in urls(dir.path()) {
        for ignore_term in [false, true] {
            n += 1;
            let dir = &Scratch::new(dir.path(), n);
            let name = unique("sigstop");
            let w = file(dir.path(), "w");
            let mut holder = cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "--lease",
                    "1500ms",
                    "--renew",
                    "300ms",
                    "--kill-grace",
                    "300ms",
                    "--",
                    "sh",
                    "-c",
                    &writer_script(ignore_term),
                ],
            )
            .env("W", &w)
            .spawn()
            .unwrap();
            let cmd = writer_started(dir.path(), &w);

            kill(holder.id(), Signal::SIGSTOP);
            // The storage's expiry as of the last renewal before the stop.
            let expiry_ms = u128::from(
                inspect(dir.path(), &url, &name)["expires_at_unix_ms"]
                    .as_u64()
                    .unwrap(),
            );
            let second = second_holder(dir, &url, &name);
            wait_until(Duration::from_secs(2), "the command to stop", || {
                !alive(cmd)
            });
            let last = *stamps(&w).last().unwrap();
            kill(holder.id(), Signal::SIGCONT);
            assert!(
                last / 1_000_000 < expiry_ms + SCHEDULING_SLACK_MS,
                "{url} (ignore TERM: {ignore_term}): a write at {} ms, the lease ended at {expiry_ms}",
                last / 1_000_000
            );
            assert!(last < second, "{url}: wrote after the next holder started");
            let status = wait_within(&mut holder, Duration::from_secs(10));
            assert_eq!(status.code(), Some(76), "{url}: {status:?}");
        }
    }
}

/// The supervisor's own path (not the sentinel's): the hold disappears from the storage, the
/// next renewal finds it gone, `run` sends SIGTERM, then SIGKILL after the grace.
#[test]
fn a_lost_lock_gets_a_command_that_ignores_sigterm_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let url = format!("sqlite://{}", db.display());
    let name = unique("lost");
    let w = file(dir.path(), "w");
    let mut holder = cli(
        dir.path(),
        &url,
        &[
            "run",
            &name,
            "--lease",
            "5s",
            "--renew",
            "200ms",
            "--kill-grace",
            "500ms",
            "--",
            "sh",
            "-c",
            &writer_script(true),
        ],
    )
    .env("W", &w)
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let cmd = writer_started(dir.path(), &w);
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg(".timeout 5000")
        .arg("DELETE FROM storage_lock")
        .output()
        .expect("the sqlite3 command-line tool");
    assert!(out.status.success(), "{out:?}");
    let deleted = now_ns();
    let status = wait_within(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(76), "{status:?}");
    assert!(!alive(cmd));
    let last = *stamps(&w).last().unwrap();
    assert!(
        last < deleted + 1_200_000_000,
        "the command wrote {} ms after the hold vanished (renew 200ms + grace 500ms)",
        (last - deleted) / 1_000_000
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lost"), "{stderr}");
}

#[test]
fn quit_usr1_usr2_and_alrm_are_forwarded_to_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for url in urls(dir.path()) {
        for signal in [
            Signal::SIGQUIT,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGALRM,
        ] {
            n += 1;
            let dir = &Scratch::new(dir.path(), n);
            let name = unique("signal");
            let ready = file(dir.path(), "ready");
            let marker = file(dir.path(), "marker");
            let traps: String = ["QUIT", "USR1", "USR2", "ALRM"]
                .iter()
                .map(|s| format!("trap 'echo {s} > \"$MARKER\"; exit 5' {s}; "))
                .collect();
            let mut holder = cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "--",
                    "sh",
                    "-c",
                    &format!("{traps}touch \"$READY\"; while :; do sleep 0.05; done"),
                ],
            )
            .env("READY", &ready)
            .env("MARKER", &marker)
            .spawn()
            .unwrap();
            wait_until(Duration::from_secs(10), "the child to be ready", || {
                ready.exists()
            });
            kill(holder.id(), signal);
            let status = wait_within(&mut holder, Duration::from_secs(10));
            assert_eq!(status.code(), Some(5), "{url}: {signal}: {status:?}");
            assert_eq!(read(&marker), &signal.as_str()[3..], "{url}");
            let record = inspect(dir.path(), &url, &name);
            assert_eq!(record["state"], "released", "{url}: {record}");
        }
    }
}

#[test]
fn processes_the_command_leaves_behind_are_stopped_before_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let name = unique("leftovers");
        let w = file(dir.path(), "w");
        let started = Instant::now();
        let out = output_within(
            cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "--",
                    "sh",
                    "-c",
                    &format!(
                        "sh -c '{}' & while [ ! -s \"$W\" ]; do sleep 0.01; done; echo started",
                        writer_script(false)
                    ),
                ],
            )
            .env("W", &w),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{url}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("left processes"), "{url}: {stderr}");
        let writer: u32 = read(&file(dir.path(), "w.pid")).parse().unwrap();
        assert!(!alive(writer), "{url}: the leftover still runs");
        let second = second_holder(dir, &url, &name);
        assert!(
            stamps(&w).iter().all(|&t| t < second),
            "{url}: the leftover wrote after the lock was released"
        );

        // A leftover that ignores SIGTERM is killed after the grace.
        // (CMD exits only once the leftover ignores SIGTERM: otherwise a fast SIGTERM can beat
        // the `trap` and the test measures nothing.)
        let ready = file(dir.path(), "trap-ready");
        let started = Instant::now();
        let out = output_within(
            cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "-q",
                    "--kill-grace",
                    "500ms",
                    "--",
                    "sh",
                    "-c",
                    "(trap '' TERM; : > \"$R\"; sleep 30) & \
                     while [ ! -e \"$R\" ]; do sleep 0.01; done; echo started",
                ],
            )
            .env("R", &ready),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(5),
            "{url}: {took:?}"
        );

        // --wait-for-group waits for them instead, holding the lock.
        let started = Instant::now();
        let out = output_within(
            &mut cli(
                dir.path(),
                &url,
                &[
                    "run",
                    &name,
                    "--wait-for-group",
                    "--",
                    "sh",
                    "-c",
                    "sleep 1 & echo started",
                ],
            ),
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        assert!(started.elapsed() >= Duration::from_millis(950), "{url}");
        assert_eq!(
            inspect(dir.path(), &url, &name)["state"],
            "released",
            "{url}"
        );
    }
}

/// With stdin a terminal (a pty from `script`), the command's group is the terminal's
/// foreground group, and a lost lock stops every process of it (here the sentinel does, as
/// `run` is stopped).
#[test]
fn on_a_terminal_the_command_gets_the_foreground_and_its_whole_tree_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in urls(dir.path()).into_iter().enumerate() {
        let dir = &Scratch::new(dir.path(), i);
        let name = unique("tty");
        let path = |f: &str| file(dir.path(), f);
        let script = path("cmd.sh");
        std::fs::write(
            &script,
            "ps -o tpgid= -o pgid= -p $$ > \"$D/fg\"; echo $PPID > \"$D/sup\"; \
             sleep 100 & echo $! > \"$D/p1\"; echo $$ > \"$D/p2\"; exec sleep 100\n",
        )
        .unwrap();
        let mut term = Command::new("script")
            .args([
                "-qec",
                "\"$BIN\" --storage \"$URL\" run \"$NAME\" --lease 1500ms --renew 300ms \
                 --kill-grace 300ms -- sh \"$SCRIPT\"",
                "/dev/null",
            ])
            .env("BIN", BIN)
            .env("URL", &url)
            .env("NAME", &name)
            .env("SCRIPT", &script)
            .env("D", dir.path())
            .env("HOME", dir.path())
            .env_remove("STORAGE_LOCK_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("script(1) from util-linux");
        wait_until(Duration::from_secs(10), "the command to start", || {
            !read(&path("p2")).is_empty() && !read(&path("fg")).is_empty()
        });
        let fg: Vec<String> = read(&path("fg"))
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(fg.len(), 2, "{url}: {fg:?}");
        assert_eq!(
            fg[0], fg[1],
            "{url}: the command's group must be the terminal's foreground group"
        );
        let p1: u32 = read(&path("p1")).parse().unwrap();
        let p2: u32 = read(&path("p2")).parse().unwrap();
        let sup: u32 = read(&path("sup")).parse().unwrap();

        kill(sup, Signal::SIGSTOP);
        wait_until(Duration::from_secs(5), "both sleeps to be stopped", || {
            !alive(p1) && !alive(p2)
        });
        kill(sup, Signal::SIGCONT);
        // script(1) stops itself when its child stops, at a time of its choosing: one SIGCONT
        // sent before it stopped itself left it stopped for good on a loaded machine. Wake it
        // (and `run`) until it exits.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = term.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{url}: script(1) did not exit within 60 s"
            );
            kill(term.id(), Signal::SIGCONT);
            kill(sup, Signal::SIGCONT);
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(status.code(), Some(76), "{url}: {status:?}");
    }
}
