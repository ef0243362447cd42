//! `acquire`, `renew` and `release`: holds that outlive the process, for shell scripts.
//!
//! `acquire` takes one level of the lock with the reentrant API under a fresh random owner id
//! and prints a [`LeaseToken`] carrying that id; nothing renews the hold afterwards, so it lasts
//! `--lease` unless the script calls `renew TOKEN` in time. The hold's recorded pid is the
//! *parent* of this process (the script that holds the lock), not this short-lived process.
//!
//! ```sh
//! token=$(storage-lock acquire nightly --wait 1m --lease 10m) || exit
//! trap 'storage-lock release "$token"' EXIT
//! do_work; storage-lock renew "$token"; do_more_work   # renews by the acquisition's 10m
//! ```
//!
//! The token carries the lease it was acquired with, so `renew TOKEN` without `--lease` keeps
//! that lease (a 10-minute hold stays a 10-minute hold); `--lease` overrides it for one renewal.
//! `release` and `renew` of a token whose hold ran out (even if nobody took the lock since) exit
//! 76: the script lost the lock.

use serde_json::json;
use storage_lock::AcquireOptions;
use storage_lock::backend::{HolderInfo, OwnerId};
use tokio::time::Instant;

use super::{busy_notice, validate_lease, validate_name};
use crate::cli::{AcquireArgs, ReleaseArgs, RenewArgs};
use crate::exit::{self, Failure};
use crate::token::LeaseToken;
use crate::{output, progress, storage};

/// The holder recorded for script-held locks: this host, the calling script's pid.
fn script_holder() -> HolderInfo {
    HolderInfo {
        pid: std::os::unix::process::parent_id(),
        ..HolderInfo::this_process()
    }
}

/// Runs `acquire`: prints the token (or a JSON object) on stdout; returns the exit code.
pub async fn acquire(
    args: AcquireArgs,
    url: Option<&str>,
    quiet: bool,
    verbose: u8,
) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    validate_lease("--lease", args.lease)?;
    let mut options = AcquireOptions::default()
        .wait(args.wait.to_wait())
        .lease(args.lease);
    options.note = args.note;
    let opened = storage::open(url, script_holder(), quiet).await?;
    let owner = OwnerId::random();
    let started = Instant::now();
    let hold = progress::while_waiting(
        progress::enabled(quiet),
        opened.storage.as_ref(),
        &args.name,
        opened
            .locks
            .acquire_as(&args.name, owner, &options, Some(script_holder())),
    )
    .await
    .map_err(|e| Failure::lock("cannot acquire the lock", &e))?;
    let hold = match hold {
        Ok(hold) => hold,
        Err(busy) => {
            // Like `flock -n`: a busy lock under --no-wait is an expected outcome, silent
            // unless -v.
            let silent = args.wait.no_wait && verbose == 0;
            busy_notice(quiet || silent, &busy, &args.name, started.elapsed());
            if args.json {
                // A script reading stdout learns the outcome too, not only from the exit code.
                // Who holds it comes with the storage's busy answer.
                let _ = output::emit(json!({
                    "acquired": false,
                    "name": args.name,
                    "holder": output::holder(busy.holder.as_deref()),
                    "lease_left_ms": u64::try_from(busy.left.as_millis()).unwrap_or(u64::MAX),
                }));
            }
            return Ok(args.conflict_exit_code);
        }
    };
    let token = LeaseToken {
        name: args.name,
        owner,
        fencing: hold.fencing_token,
        lease: Some(args.lease),
    };
    let printed = if args.json {
        output::emit(json!({
            "acquired": true,
            "token": token.to_string(),
            "name": token.name,
            "fencing_token": hold.fencing_token,
            "expires_at": output::rfc3339(hold.expires_at),
        }))
    } else {
        output::emit(&token)
    };
    if let Err(e) = printed {
        // Nobody could ever release a hold whose token was not delivered: undo it.
        let _ = opened.locks.release_as(&token.name, owner).await;
        return Err(Failure::new(
            exit::INTERNAL,
            format!("cannot print the lease token (the lock was released again): {e}"),
        ));
    }
    Ok(0)
}

/// Runs `renew`: prints the new expiry; exit 76 if the token no longer holds its lock.
pub async fn renew(args: RenewArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let token = parse(&args.token)?;
    let lease = args.lease.unwrap_or_else(|| token.default_lease());
    validate_lease("--lease", lease)?;
    let opened = storage::open(url, script_holder(), quiet).await?;
    let expires_at = opened
        .locks
        .renew_as(&token.name, token.owner, lease)
        .await
        .map_err(|e| Failure::lock("cannot renew the lock", &e))?
        .ok_or_else(|| not_held(&token))?;
    if args.json {
        let _ = output::emit(json!({
            "name": token.name,
            "fencing_token": token.fencing,
            "expires_at": output::rfc3339(expires_at),
        }));
    } else {
        let _ = output::emit(output::rfc3339(expires_at));
    }
    Ok(0)
}

/// Runs `release`; exit 76 if the token no longer holds its lock — also when its lease ran out
/// and nobody took the lock since (the storage would still accept the release of such a record:
/// the script has lost the lock all the same, like `renew` reports).
pub async fn release(args: ReleaseArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    if args.force {
        let args = crate::cli::BreakArgs {
            name: args.token,
            yes: args.yes,
        };
        return crate::commands::admin::break_lock(args, url, quiet).await;
    }
    let token = parse(&args.token)?;
    let opened = storage::open(url, script_holder(), quiet).await?;
    // A lock server never shows owners: there the release's own answer is all we learn.
    if storage::shows_owners(opened.storage.as_ref()) {
        let live = opened
            .locks
            .fencing_token(&token.name, token.owner)
            .await
            .map_err(|e| Failure::lock("cannot read the lock", &e))?;
        if live != Some(token.fencing) {
            // Still tidy up an expired record of this owner (a no-op if someone else holds it).
            let _ = opened.locks.release_as(&token.name, token.owner).await;
            return Err(not_held(&token));
        }
    }
    match opened.locks.release_as(&token.name, token.owner).await {
        // The release names the hold it ended: it must be this token's.
        Ok(Some(fencing)) if fencing == token.fencing => Ok(0),
        Ok(_) => Err(not_held(&token)),
        Err(e) => Err(Failure::lock("cannot release the lock", &e)),
    }
}

fn parse(token: &str) -> Result<LeaseToken, Failure> {
    let token: LeaseToken = token.parse().map_err(Failure::usage)?;
    validate_name(&token.name)?;
    Ok(token)
}

fn not_held(token: &LeaseToken) -> Failure {
    Failure::new(
        exit::LOST,
        format!(
            "lock {} is no longer held by this token (fencing token {}): it was released, \
             or its lease ran out",
            output::quoted(&token.name),
            token.fencing
        ),
    )
}
