//! A worker process: takes locks of the tortured storage and does a read-modify-write of the
//! register under each hold.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::mutant::{self, Mutation};
use super::{Kind, WORKER, parse_kind};
use crate::exit;

/// A worker process: `__torture-worker REGISTER PREFIX NAMES LEASE_MS ID KIND MUTATION URL`
/// (an empty URL: the default storage; `none`: no mutation). Returns its exit code.
pub fn worker_main(args: &[String]) -> u8 {
    let [register, prefix, names, lease_ms, id, kind, mutation, url] = args else {
        eprintln!("storage-lock: {WORKER} is internal to `storage-lock torture`");
        return exit::USAGE;
    };
    let (Ok(names), Ok(lease_ms), Ok(id), Ok(kind), Ok(mutation)) = (
        names.parse::<u32>(),
        lease_ms.parse::<u64>(),
        id.parse::<u32>(),
        parse_kind(kind),
        match mutation.as_str() {
            "none" => Ok(None),
            m => mutant::parse_mutation(m).map(Some),
        },
    ) else {
        return exit::USAGE;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return exit::INTERNAL;
    };
    let url = (!url.is_empty()).then_some(url.as_str());
    let lease = Duration::from_millis(lease_ms);
    runtime.block_on(async move {
        match work(register, prefix, names, lease, id, kind, mutation, url).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("storage-lock: torture worker {id}: {e}");
                exit::INTERNAL
            }
        }
    })
}

/// A worker's hold: a lock's, a semaphore permit's, or a reader-writer lock's.
enum Held {
    Lock(storage_lock::LockHandle),
    Permit(storage_lock::kinds::Permit),
    Read(storage_lock::kinds::ReadGuard),
    Write(storage_lock::kinds::WriteGuard),
}

impl Held {
    fn is_lost(&self) -> bool {
        match self {
            Self::Lock(h) => h.is_lost(),
            Self::Permit(p) => p.is_lost(),
            Self::Read(r) => r.is_lost(),
            Self::Write(w) => w.is_lost(),
        }
    }

    /// A reader's hold: shares the name, writes nothing.
    fn is_shared(&self) -> bool {
        matches!(self, Self::Read(_))
    }

    async fn release(self) {
        let _ = match self {
            Self::Lock(h) => h.release().await,
            Self::Permit(p) => p.release().await,
            Self::Read(r) => r.release().await,
            Self::Write(w) => w.release().await,
        };
    }
}

/// Takes `name` as `kind` says: the hold, the name the register checks (a semaphore's slot
/// is a name of its own) and the token; `None` when it stayed busy. Of a reader-writer lock,
/// one take in three writes.
async fn take(
    locks: &storage_lock::StorageLock,
    kind: Kind,
    name: &str,
    options: &storage_lock::AcquireOptions,
) -> Result<Option<(Held, String, u64)>, storage_lock::LockError> {
    use storage_lock::kinds::{FairLock, RwLock, Semaphore, slot_name};
    let whole = |held: Held, token: u64| (held, name.to_owned(), token);
    Ok(match kind {
        Kind::Exclusive => locks.try_acquire(name, options).await?.map(|h| {
            let token = h.fencing_token();
            whole(Held::Lock(h), token)
        }),
        Kind::Fair => FairLock::new(locks, name)?
            .acquire(options)
            .await?
            .map(|h| {
                let token = h.fencing_token();
                whole(Held::Lock(h), token)
            }),
        Kind::Semaphore(n) => Semaphore::new(locks, name, n)?
            .acquire(options)
            .await?
            .map(|p| {
                let (slot, token) = p.fencing_token();
                (Held::Permit(p), slot_name(name, slot), token)
            }),
        Kind::Rw if rand::random_range(0..3) == 0 => {
            RwLock::new(locks, name)?.write(options).await?.map(|w| {
                let token = w.fencing_token();
                whole(Held::Write(w), token)
            })
        }
        Kind::Rw => RwLock::new(locks, name)?.read(options).await?.map(|r| {
            let token = r.fencing_token();
            whole(Held::Read(r), token)
        }),
    })
}

/// A worker's loop: take a random name, read the register, wait, ask the handle whether the
/// hold is lost, write with the token (lost or not: fencing must stop a stale write) or, a
/// reader, say the read ended; release; until the register goes away.
#[allow(clippy::too_many_arguments)]
async fn work(
    register: &str,
    prefix: &str,
    names: u32,
    lease: Duration,
    id: u32,
    kind: Kind,
    mutation: Option<Mutation>,
    url: Option<&str>,
) -> Result<(), String> {
    let mut opened =
        crate::storage::open(url, storage_lock::backend::HolderInfo::this_process(), true)
            .await
            .map_err(|e| e.to_string())?;
    if let Some(mutation) = mutation {
        opened.locks =
            mutant::locks(opened.storage.clone(), mutation).map_err(|e| e.to_string())?;
    }
    let stream = TcpStream::connect(register)
        .await
        .map_err(|e| format!("the register: {e}"))?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let options = storage_lock::AcquireOptions::default()
        .lease(lease)
        .auto_renew(lease / 3)
        .wait(storage_lock::Wait::For(lease * 4));
    loop {
        let name = format!("{prefix}{}", rand::random_range(0..names));
        let (held, checked, token) = match take(&opened.locks, kind, &name, &options).await {
            Ok(Some(taken)) => taken,
            Ok(None) => continue,
            // A storage error under faults: try again (the verdict counts grants, not tries).
            Err(_) => {
                tokio::time::sleep(lease / 10).await;
                continue;
            }
        };
        let start = if held.is_shared() { "S" } else { "R" };
        write
            .write_all(format!("{start} {checked} {token} {id}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let Some(value) = lines.next_line().await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        // Stay a moment: a pause or a kill lands inside holds, and holders meet.
        tokio::time::sleep(Duration::from_millis(rand::random_range(
            0..=lease_ms_tenth(lease),
        )))
        .await;
        // The clock first: the handle's answer holds at least from this reading on.
        let checked_ns = super::register::boot_ns();
        let lost = u8::from(held.is_lost());
        let end = if held.is_shared() {
            format!("E {checked} {token} {id} {checked_ns} {lost}\n")
        } else {
            format!("W {checked} {value} {token} {id} {checked_ns} {lost}\n")
        };
        write
            .write_all(end.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        if lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Ok(());
        }
        held.release().await;
    }
}

/// A tenth of `lease` in milliseconds.
fn lease_ms_tenth(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis() / 10).unwrap_or(u64::MAX)
}
