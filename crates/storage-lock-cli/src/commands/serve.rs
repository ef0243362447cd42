//! `serve` (the lock server over the chosen storage) and `token` (a bearer token for it).

use std::net::SocketAddr;

use std::path::PathBuf;
use std::time::Duration;
use storage_lock::backend::HolderInfo;

use storage_lock_server::{Auth, AuthHandle, Server, TlsConfig, hash_token};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::{ServeArgs, TokenArgs};
use crate::exit::{self, Failure};
use crate::storage;

/// Runs `serve`: opens the storage, refuses an unauthenticated non-loopback listener unless
/// `--insecure-no-auth`, serves until SIGTERM or SIGINT, then finishes requests in flight.
pub async fn serve(args: ServeArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let addr: SocketAddr = args.listen.parse().map_err(|_| {
        Failure::usage(format!(
            "--listen {:?} is not an address such as 127.0.0.1:7420",
            args.listen
        ))
    })?;
    let auth = match &args.auth {
        Some(path) => {
            Some(Auth::from_file(path).map_err(|e| Failure::new(exit::CONFIG, e.to_string()))?)
        }
        None if !addr.ip().is_loopback() && !args.insecure_no_auth => {
            return Err(Failure::usage(format!(
                "refusing to serve {addr} without --auth (anyone reaching it could lock and \
                 release anything); pass --auth FILE, or --insecure-no-auth if you mean it"
            )));
        }
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            TlsConfig::from_pem_files(cert, key, args.tls_client_ca.as_deref())
                .map_err(|e| Failure::new(exit::CONFIG, e.to_string()))?,
        ),
        _ => None,
    };
    if !quiet && tls.is_none() && auth.is_some() && !addr.ip().is_loopback() {
        eprintln!(
            "storage-lock: warning: bearer tokens cross the network in clear on {addr}; pass \
             --tls-cert and --tls-key (or put a TLS proxy in front)"
        );
    }
    // A server logs its admin actions (who force-released what) even without -v.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,storage_lock::audit=info")
            }),
        )
        .try_init();
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(exit::STORAGE, format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let mut server = Server::new(opened.locks);
    if let Some(auth) = auth {
        server = server.auth(auth);
    }
    match storage_lock_server::install_prometheus() {
        Ok(handle) => server = server.metrics(handle),
        Err(e) => tracing::warn!(error = %e, "metrics recorder not installed"),
    }
    // Watch SIGTERM (and SIGHUP, for the auth file) before saying we serve: a supervisor may
    // signal us right after.
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot watch SIGTERM: {e}")))?;
    if let (Some(path), Some(handle)) = (&args.auth, server.auth_handle()) {
        let hup = signal(SignalKind::hangup())
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot watch SIGHUP: {e}")))?;
        tokio::spawn(reload_auth(path.clone(), handle, hup));
    }
    if !quiet {
        let scheme = if tls.is_some() { "https" } else { "http" };
        eprintln!(
            "storage-lock: serving {} on {scheme}://{bound} (OpenAPI: {scheme}://{bound}/openapi.json)",
            opened.shown
        );
    }
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    match &tls {
        Some(tls) => server.serve_tls(listener, tls, shutdown).await,
        None => server.serve(listener, shutdown).await,
    }
    .map_err(|e| Failure::new(exit::STORAGE, format!("serving failed: {e}")))?;
    if !quiet {
        eprintln!("storage-lock: server stopped");
    }
    Ok(0)
}

/// Runs `token`: prints a fresh random token (on a comment line) and its auth-file entry.
pub fn token(args: &TokenArgs) -> Result<u8, Failure> {
    let secret = format!("{:032x}{:032x}", rand_u128(), rand_u128());
    // The entry goes to stdout (safe to append to the auth file: it holds only the hash), the
    // secret to stderr or to --secret-file (readable by its owner only).
    match &args.secret_file {
        Some(path) => write_secret(path, &secret).map_err(|e| {
            Failure::usage(format!("cannot write the token to {}: {e}", path.display()))
        })?,
        None => eprintln!(
            "storage-lock: bearer token for {:?} (give it to the client, keep it secret): {secret}",
            args.name
        ),
    }
    println!("[[token]]");
    println!("name = {}", toml_string(&args.name));
    println!("sha256 = \"{}\"", hash_token(&secret));
    println!(
        "grants = [{{ prefix = {}, allow = \"{}\" }}]",
        toml_string(&args.prefix),
        args.allow
    );
    Ok(0)
}

/// Writes `secret` and a newline to `path`, created or truncated with mode 0600.
fn write_secret(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{secret}")
}

/// Re-reads the auth file on SIGHUP and when it changes (checked every second), and puts the
/// new tokens in force; a file that does not parse leaves the old ones, with a warning.
async fn reload_auth(path: PathBuf, handle: AuthHandle, mut hup: Signal) {
    let stamp = |p: &std::path::Path| {
        std::fs::metadata(p).ok().map(|m| {
            (
                m.modified().ok(),
                m.len(),
                std::os::unix::fs::MetadataExt::ino(&m),
            )
        })
    };
    let mut seen = stamp(&path);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let why = tokio::select! {
            _ = hup.recv() => "SIGHUP",
            _ = tick.tick() => {
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                "the file changed"
            }
        };
        match Auth::from_file(&path) {
            Ok(auth) => {
                let tokens = auth.len();
                handle.replace(auth);
                tracing::info!(target: "storage_lock::audit", tokens, why, "auth file reloaded");
            }
            Err(e) => tracing::warn!(
                target: "storage_lock::audit",
                error = %e,
                why,
                "auth file not reloaded: the tokens in force stay"
            ),
        }
    }
}

fn rand_u128() -> u128 {
    storage_lock::backend::OwnerId::random().as_u128()
}

/// A TOML basic string (JSON string escaping is valid TOML).
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}
