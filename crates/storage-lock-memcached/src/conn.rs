//! A minimal client of memcached's meta protocol (1.6): one request at a time per connection,
//! every answer bounded in size. A connection that failed or timed out mid-request is dropped by
//! its owner (its stream may hold half an answer).

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

/// The longest answer line read (a `metadump` line names one item).
const MAX_LINE: u64 = 4096;
/// The largest value read back: memcached's default `item_size_max`.
const MAX_VALUE: usize = 1 << 20;

/// One meta command's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// `HD`: stored or deleted, with the item's CAS when asked for (`c`).
    Done { cas: Option<u64> },
    /// `NS`: not stored (an add, `ME`, of a key that exists).
    NotStored,
    /// `EX`: the CAS given did not match the item's.
    Exists,
    /// `NF`: no such item.
    NotFound,
    /// `EN`: a get's miss.
    Miss,
    /// `VA`: a get's value, with the item's CAS when asked for (`c`).
    Value { cas: Option<u64>, data: Vec<u8> },
}

/// A connection to one server.
pub(crate) struct Conn {
    io: BufStream<TcpStream>,
}

impl Conn {
    pub(crate) async fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            io: BufStream::new(stream),
        })
    }

    /// Sends the meta command `line` (with `data` after it, for a set) and reads its answer.
    ///
    /// # Errors
    /// I/O errors, and any answer that is not a meta answer (`CLIENT_ERROR`, `SERVER_ERROR`,
    /// `ERROR`, or malformed) as [`io::ErrorKind::Other`] naming it.
    pub(crate) async fn meta(&mut self, line: &str, data: Option<&[u8]>) -> io::Result<Reply> {
        self.io.write_all(line.as_bytes()).await?;
        self.io.write_all(b"\r\n").await?;
        if let Some(data) = data {
            self.io.write_all(data).await?;
            self.io.write_all(b"\r\n").await?;
        }
        self.io.flush().await?;
        let head = self.line().await?;
        let mut words = head.split(' ');
        let code = words.next().unwrap_or_default();
        let size = words.next();
        let cas = head
            .split(' ')
            .skip(1)
            .find_map(|w| w.strip_prefix('c').and_then(|n| n.parse::<u64>().ok()));
        let reply = match code {
            "HD" => Reply::Done { cas },
            "NS" => Reply::NotStored,
            "EX" => Reply::Exists,
            "NF" => Reply::NotFound,
            "EN" => Reply::Miss,
            // The no-op's answer (`mn`): a server that speaks the meta protocol.
            "MN" => Reply::Done { cas: None },
            "VA" => {
                let size = size
                    .and_then(|s| s.parse::<usize>().ok())
                    .filter(|&s| s <= MAX_VALUE)
                    .ok_or_else(|| unexpected(&head))?;
                let mut data = vec![0; size + 2];
                self.io.read_exact(&mut data).await?;
                if !data.ends_with(b"\r\n") {
                    return Err(unexpected(&head));
                }
                data.truncate(size);
                Reply::Value { cas, data }
            }
            _ => return Err(unexpected(&head)),
        };
        Ok(reply)
    }

    /// Sends a text command whose answer is lines ending with `END` (`stats settings`,
    /// `lru_crawler metadump all`), and returns those lines; at most `max` of them.
    ///
    /// # Errors
    /// I/O errors; more than `max` lines; an error answer (as [`io::ErrorKind::Other`] naming
    /// it); `BUSY` (another crawl runs) as [`io::ErrorKind::ResourceBusy`].
    pub(crate) async fn lines(&mut self, command: &str, max: usize) -> io::Result<Vec<String>> {
        self.io.write_all(command.as_bytes()).await?;
        self.io.write_all(b"\r\n").await?;
        self.io.flush().await?;
        let mut lines = Vec::new();
        loop {
            let line = self.line().await?;
            if line == "END" {
                return Ok(lines);
            }
            if lines.is_empty() && line.starts_with("BUSY") {
                // Another crawl (a concurrent listing) is running: ask again.
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    unexpected(&line),
                ));
            }
            if lines.is_empty()
                && (line.starts_with("ERROR")
                    || line.starts_with("CLIENT_ERROR")
                    || line.starts_with("SERVER_ERROR"))
            {
                return Err(unexpected(&line));
            }
            if lines.len() >= max {
                return Err(io::Error::other(format!(
                    "memcached answered {command:?} with more than {max} lines"
                )));
            }
            lines.push(line);
        }
    }

    /// One answer line without its line end (`\r\n`; `metadump` ends its lines with `\n`).
    async fn line(&mut self) -> io::Result<String> {
        let mut buf = Vec::new();
        let read = (&mut self.io)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .await?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if buf.pop() != Some(b'\n') {
            return Err(io::Error::other("memcached sent an answer line over 4 KiB"));
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        String::from_utf8(buf).map_err(|_| io::Error::other("memcached sent a non-UTF-8 line"))
    }
}

fn unexpected(line: &str) -> io::Error {
    let shown: String = line.chars().take(200).collect();
    io::Error::other(format!("memcached answered {shown:?}"))
}
