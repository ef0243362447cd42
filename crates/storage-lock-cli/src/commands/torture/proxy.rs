//! The `cut` fault: the workers reach the storage through a loopback TCP proxy that this
//! command runs, and a cut closes every connection through it and blackholes new ones (accepted,
//! never forwarded) for a while, as a network partition between the workers and the storage
//! would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Where a storage URL's server is, and the URL pointed at another address instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Route {
    /// The server's `host:port`.
    pub(super) target: String,
    before: String,
    after: String,
}

impl Route {
    /// The URL with `addr` in place of the server's address.
    pub(super) fn through(&self, addr: SocketAddr) -> String {
        format!("{}{addr}{}", self.before, self.after)
    }
}

/// The default port of a scheme whose URL may leave it out.
fn default_port(scheme: &str) -> Option<u16> {
    Some(match scheme {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        "redis" => 6379,
        "etcd" => 2379,
        "nats" => 4222,
        "memcached" => 11211,
        "zookeeper" => 2181,
        "http" => 80,
        _ => return None,
    })
}

/// The route of a storage URL through a proxy, or why it has none: a file or in-process
/// storage, several hosts (a cluster: its clients learn the other members' addresses from the
/// servers, past any proxy), or an unknown scheme.
///
/// # Errors
/// The reason, as one line.
pub(super) fn route(url: &str) -> Result<Route, String> {
    // Object storage: the server is the `endpoint` parameter.
    if let Some(start) = url.find("endpoint=") {
        let value_at = start + "endpoint=".len();
        let end = url[value_at..]
            .find('&')
            .map_or(url.len(), |i| value_at + i);
        let endpoint = &url[value_at..end];
        let (scheme, rest) = endpoint
            .split_once("://")
            .ok_or("cut: the endpoint has no scheme")?;
        if scheme != "http" {
            return Err("cut: only an http:// endpoint can be cut (TLS names its host)".into());
        }
        let host = rest.split('/').next().unwrap_or(rest);
        let target = with_port(host, 80);
        return Ok(Route {
            target,
            before: format!("{}http://", &url[..value_at]),
            after: format!("{}{}", &rest[host.len()..], &url[end..]),
        });
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("cut needs a storage reached over the network (a URL with a host)")?;
    let port = default_port(scheme)
        .ok_or_else(|| format!("cut needs a storage reached over the network, not {scheme}:"))?;
    if url.contains("cluster=true") {
        return Err("cut: a cluster's clients reach its nodes past any proxy".into());
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_at = authority.rfind('@').map_or(0, |i| i + 1);
    let host = &authority[host_at..];
    if host.is_empty() {
        return Err("cut needs a URL with a host".into());
    }
    if host.contains(',') {
        return Err(
            "cut: a URL with several hosts (a cluster) cannot be cut through one proxy".into(),
        );
    }
    Ok(Route {
        target: with_port(host, port),
        before: format!("{scheme}://{}", &authority[..host_at]),
        after: rest[authority_end..].to_owned(),
    })
}

/// `host` with `port` added unless it has one (`[v6]:port` understood).
fn with_port(host: &str, port: u16) -> String {
    let has_port = match host.rfind(']') {
        Some(close) => host[close..].contains(':'),
        None => host.contains(':'),
    };
    if has_port {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    }
}

/// A running proxy: its address and the switch that cuts it.
pub(super) struct Proxy {
    pub(super) addr: SocketAddr,
    /// `true` while cut.
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a loopback port and forwards every connection to `target`.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub(super) async fn start(target: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, watching) = watch::channel(false);
        let target = Arc::new(target);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, mut watching) = (target.clone(), watching.clone());
                tokio::spawn(async move {
                    if *watching.borrow_and_update() {
                        // Blackholed: held open, never forwarded, closed when the cut ends.
                        let _ = watching.wait_for(|cut| !cut).await;
                        drop(client);
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(target.as_str()).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        // A cut closes both sides at once.
                        _ = watching.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Self { addr, cut, task })
    }

    /// Cuts every connection and blackholes new ones for `how_long`.
    pub(super) async fn cut_for(&self, how_long: Duration) {
        let _ = self.cut.send(true);
        tokio::time::sleep(how_long).await;
        let _ = self.cut.send(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_routed_through_the_proxy() {
        let proxy: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        for (url, target, through) in [
            (
                "postgres://u:p@db.example:6543/locks?table=t",
                "db.example:6543",
                "postgres://u:p@127.0.0.1:9999/locks?table=t",
            ),
            (
                "redis://127.0.0.1/?prefix=x:",
                "127.0.0.1:6379",
                "redis://127.0.0.1:9999/?prefix=x:",
            ),
            (
                "etcd://127.0.0.1:2389?prefix=a/",
                "127.0.0.1:2389",
                "etcd://127.0.0.1:9999?prefix=a/",
            ),
            ("nats://h:4230", "h:4230", "nats://127.0.0.1:9999"),
            (
                "zookeeper://zk/app/locks?timeout=1s",
                "zk:2181",
                "zookeeper://127.0.0.1:9999/app/locks?timeout=1s",
            ),
            (
                "memcached://127.0.0.1?durability=volatile",
                "127.0.0.1:11211",
                "memcached://127.0.0.1:9999?durability=volatile",
            ),
            (
                "s3://bucket/p?endpoint=http://127.0.0.1:4570&region=us-east-1",
                "127.0.0.1:4570",
                "s3://bucket/p?endpoint=http://127.0.0.1:9999&region=us-east-1",
            ),
            ("http://[::1]:7420", "[::1]:7420", "http://127.0.0.1:9999"),
        ] {
            let r = route(url).unwrap();
            assert_eq!(r.target, target, "{url}");
            assert_eq!(r.through(proxy), through, "{url}");
        }
        for no in [
            "sqlite:///tmp/x.db",
            "memory:",
            "nats://a:1,b:2",
            "zookeeper://a:1,b:2/locks",
            "redis://127.0.0.1:6400/?cluster=true",
            "https://locks.example",
        ] {
            assert!(route(no).is_err(), "{no}");
        }
    }
}
