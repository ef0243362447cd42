//! The checked register: a counter per name that refuses writes with a stale fencing token, and
//! records what fencing could not stop (see the [module docs](super)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// What the register saw and the faults caused.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) reads: u64,
    pub(super) accepted: u64,
    pub(super) fenced_off: u64,
    pub(super) violations: Vec<String>,
    pub(super) faults: HashMap<&'static str, u64>,
}

/// One name's state in the register.
#[derive(Debug, Default)]
struct Cell {
    value: u64,
    /// The highest token of an accepted write (0: none yet).
    token: u64,
}

/// The register's answer to one request line.
fn answer(cells: &mut HashMap<String, Cell>, tally: &mut Tally, line: &str) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["R", name] => {
            tally.reads += 1;
            cells
                .entry((*name).to_owned())
                .or_default()
                .value
                .to_string()
        }
        ["W", name, read, token, worker] => {
            let (Ok(read), Ok(token)) = (read.parse::<u64>(), token.parse::<u64>()) else {
                return "error".to_owned();
            };
            let cell = cells.entry((*name).to_owned()).or_default();
            if token < cell.token {
                tally.fenced_off += 1;
                return "stale".to_owned();
            }
            if token == cell.token {
                tally.violations.push(format!(
                    "repeated token: worker {worker} wrote {name:?} with token {token}, the token of the last accepted write"
                ));
                return "violation".to_owned();
            }
            if read != cell.value {
                tally.violations.push(format!(
                    "lost update: worker {worker} (token {token}) read {name:?} = {read}, but a write with token {} made it {} before this write",
                    cell.token, cell.value
                ));
                // Keep the register consistent with the accepted write: the next checks stay exact.
                cell.value = read;
            }
            cell.value += 1;
            cell.token = token;
            tally.accepted += 1;
            "ok".to_owned()
        }
        _ => "error".to_owned(),
    }
}

/// Serves the register on `listener` until the process ends.
pub(super) async fn serve(listener: TcpListener, tally: Arc<Mutex<Tally>>) {
    let cells = Arc::new(Mutex::new(HashMap::new()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (cells, tally) = (cells.clone(), tally.clone());
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = {
                    let mut cells = cells
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let mut tally = tally
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    answer(&mut cells, &mut tally, &line)
                };
                if write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_fences_stale_writes_and_reports_what_fencing_missed() {
        let (mut cells, mut t) = (HashMap::new(), Tally::default());
        assert_eq!(answer(&mut cells, &mut t, "R a"), "0");
        assert_eq!(answer(&mut cells, &mut t, "W a 0 5 w1"), "ok");
        // A stale holder (lower token) is refused: fencing did its job.
        assert_eq!(answer(&mut cells, &mut t, "W a 0 4 w2"), "stale");
        assert!(t.violations.is_empty());
        // The same token twice: two grants with one token.
        assert_eq!(answer(&mut cells, &mut t, "W a 1 5 w3"), "violation");
        // A higher token whose read is stale: two holds overlapped unfenced.
        assert_eq!(answer(&mut cells, &mut t, "W a 0 6 w4"), "ok");
        assert_eq!(t.violations.len(), 2, "{:?}", t.violations);
        assert_eq!((t.accepted, t.fenced_off), (2, 1));
        assert_eq!(answer(&mut cells, &mut t, "nonsense"), "error");
    }
}
