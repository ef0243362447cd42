//! `storage-lock`: a distributed `flock(1)` for shells, cron and CI.
//!
//! ```text
//! storage-lock run nightly-report --wait 10m -- ./report.sh      # hold the lock while it runs
//! token=$(storage-lock acquire deploy --lease 5m)                # hold it from a script …
//! storage-lock renew "$token" --lease 5m; storage-lock release "$token"
//! storage-lock list; storage-lock inspect deploy; storage-lock sweep --older-than 30d
//! ```
//!
//! The storage comes from `--storage URL` or `STORAGE_LOCK_URL` (any scheme
//! `storage_lock::connect` knows); without either, an embedded SQLite file per user (see
//! [`storage`]), so two shells on one host exclude each other with nothing installed. Lock names
//! are storage keys as they are (no prefix), so every tool sharing the storage sees the same
//! names.
//!
//! Errors are one line on stderr (`storage-lock: error: …`) with a stable exit code (see
//! [`exit`]); bad input is rejected before the storage is opened wherever possible.
//!
//! This library is the whole command; the `storage-lock` binary only calls [`main`]. Its
//! modules are public for documentation and for the binary, not as a stable Rust API.

pub mod cli;
pub mod commands;
pub mod exit;
pub mod group;
pub mod output;
pub mod progress;
pub mod run;
pub mod sentinel;
pub mod signals;
pub mod storage;
pub mod token;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::cli::{Cli, Command};
use crate::exit::Failure;

/// Runs the command line of this process and returns its exit code. Never panics on bad input;
/// an internal panic is reported as one line and exits 70.
pub fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let info = info.to_string();
        eprintln!(
            "storage-lock: internal error (please report it): {}",
            info.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        std::process::exit(i32::from(exit::INTERNAL));
    }));
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.first().map(String::as_str) == Some(group::FOREGROUND_EXEC) {
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
        return ExitCode::from(group::foreground_exec(&args));
    }
    if args.first().map(String::as_str) == Some(commands::torture::WORKER) {
        return ExitCode::from(commands::torture::worker_main(&args[1..]));
    }
    if args.first().map(String::as_str) == Some(sentinel::SUBCOMMAND) {
        return ExitCode::from(sentinel::main(&args[1..]));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e),
    };
    init_logging(cli.verbose);
    storage::set_verbose(cli.verbose > 0 && !cli.quiet);
    // One thread does for a command (a few requests at a time); a server answers many clients
    // at once, so `serve` gets a worker per core (`TOKIO_WORKER_THREADS` sets the number).
    let mut builder = if matches!(cli.command, Command::Serve(_)) {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.thread_name("serve-worker");
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            return report(&Failure::new(
                exit::INTERNAL,
                format!("cannot start the runtime: {e}"),
            ));
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => report(&failure),
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let url = cli.storage.as_deref();
    let quiet = cli.quiet;
    match cli.command {
        Command::Run(args) => run::run(args, url, quiet, cli.verbose).await,
        Command::Acquire(args) => commands::acquire::acquire(args, url, quiet, cli.verbose).await,
        Command::Renew(args) => commands::acquire::renew(args, url, quiet).await,
        Command::Release(args) => commands::acquire::release(args, url, quiet).await,
        Command::Elect(args) => commands::elect::elect(args, url, quiet, cli.verbose).await,
        Command::Leader(args) => commands::elect::leader(args, url, quiet).await,
        Command::List(args) => commands::inspect::list(args, url, quiet).await,
        Command::Inspect(args) => commands::inspect::inspect(args, url, quiet).await,
        Command::Sweep(args) => commands::sweep::sweep(args, url, quiet).await,
        Command::Break(args) => commands::admin::break_lock(args, url, quiet).await,
        Command::Check(args) => commands::admin::check(args, url, quiet).await,
        Command::Serve(args) => commands::serve::serve(args, url, quiet).await,
        Command::Token(args) => commands::serve::token(&args),
        Command::Torture(args) => commands::torture::torture(args, url, quiet).await,
    }
}

/// Prints `failure` as one line and returns its exit code.
fn report(failure: &Failure) -> ExitCode {
    eprintln!("storage-lock: error: {failure}");
    ExitCode::from(failure.code)
}

/// Help and version go out as clap renders them; every other parse error becomes one line
/// (exit 2).
fn clap_error(e: &clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE));
    }
    // clap's message runs until the first blank line or the usage line; keep that, on one line.
    let rendered = e.to_string();
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    // `run NAME CMD` (flock's syntax without `--`): say where the command goes.
    let run_without_dashes = e.kind() == ErrorKind::UnknownArgument
        && std::env::args().skip(1).any(|a| a == "run")
        && !std::env::args().any(|a| a == "--");
    if run_without_dashes {
        return report(&Failure::usage(format!(
            "{message} (the command goes after `--`: storage-lock run NAME [OPTIONS] -- CMD [ARGS]...)"
        )));
    }
    report(&Failure::usage(format!("{message} (see --help)")))
}

/// `-v`: debug logs of storage-lock's crates on stderr; `-vv`: trace. `RUST_LOG` overrides.
fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => return,
        1 => "debug",
        _ => "trace",
    };
    let default =
        format!("warn,storage_lock={level},storage_lock_core={level},storage_lock_sql={level}");
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
