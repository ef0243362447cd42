//! A worker process: takes locks of the tortured storage and does a read-modify-write of the
//! register under each hold.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{Kind, WORKER, parse_kind};
use crate::exit;

/// A worker process: `__torture-worker REGISTER PREFIX NAMES LEASE_MS ID KIND URL` (an empty
/// URL: the default storage). Returns its exit code.
pub fn worker_main(args: &[String]) -> u8 {
    let [register, prefix, names, lease_ms, id, kind, url] = args else {
        eprintln!("storage-lock: {WORKER} is internal to `storage-lock torture`");
        return exit::USAGE;
    };
    let (Ok(names), Ok(lease_ms), Ok(kind)) = (
        names.parse::<u32>(),
        lease_ms.parse::<u64>(),
        parse_kind(kind),
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
        match work(register, prefix, names, lease, id, kind, url).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("storage-lock: torture worker {id}: {e}");
                exit::INTERNAL
            }
        }
    })
}

/// A worker's hold: a lock's or a semaphore permit's.
enum Held {
    Lock(storage_lock::LockHandle),
    Permit(storage_lock::kinds::Permit),
}

impl Held {
    async fn release(self) {
        let _ = match self {
            Self::Lock(h) => h.release().await,
            Self::Permit(p) => p.release().await,
        };
    }
}

/// Takes `name` as `kind` says: the hold, the name the register checks (a semaphore's slot
/// is a name of its own) and the token; `None` when it stayed busy.
async fn take(
    locks: &storage_lock::StorageLock,
    kind: Kind,
    name: &str,
    options: &storage_lock::AcquireOptions,
) -> Result<Option<(Held, String, u64)>, storage_lock::LockError> {
    use storage_lock::kinds::{FairLock, Semaphore, slot_name};
    Ok(match kind {
        Kind::Exclusive => locks
            .try_acquire(name, options)
            .await?
            .map(|h| (h.fencing_token(), Held::Lock(h)))
            .map(|(t, h)| (h, name.to_owned(), t)),
        Kind::Fair => FairLock::new(locks, name)?
            .acquire(options)
            .await?
            .map(|h| (h.fencing_token(), Held::Lock(h)))
            .map(|(t, h)| (h, name.to_owned(), t)),
        Kind::Semaphore(n) => Semaphore::new(locks, name, n)?
            .acquire(options)
            .await?
            .map(|p| {
                let (slot, token) = p.fencing_token();
                (Held::Permit(p), slot_name(name, slot), token)
            }),
    })
}

/// A worker's loop: take a random name, read the register, wait, write with the token,
/// release; until the register goes away.
async fn work(
    register: &str,
    prefix: &str,
    names: u32,
    lease: Duration,
    id: &str,
    kind: Kind,
    url: Option<&str>,
) -> Result<(), String> {
    let opened = crate::storage::open(url, storage_lock::backend::HolderInfo::this_process(), true)
        .await
        .map_err(|e| e.to_string())?;
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
        write
            .write_all(format!("R {checked}\n").as_bytes())
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
        write
            .write_all(format!("W {checked} {value} {token} {id}\n").as_bytes())
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
