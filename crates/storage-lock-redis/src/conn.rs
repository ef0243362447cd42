//! Where commands go: one server through a [`ConnectionManager`], or a Redis Cluster through
//! a [`ClusterConnection`] that follows `MOVED`/`ASK` and refreshes its slot map after a
//! failover.
//!
//! On a cluster every key of a storage shares the prefix's hash tag, hence one slot: the
//! scripts (record + fencing floor, `renew_many` over many records) never span two slots, and
//! the commands that carry no key (`SCAN`, `TIME`, `CONFIG GET`, `WAIT`) are routed to the
//! primary of that slot, so they see the same server the scripts write to.
//!
//! `WAIT n` after a write (`replicas=n`) makes an acknowledged write one that `n` replicas
//! hold: with `n` equal to the shard's replica count, the replica a failover promotes holds
//! every grant, renewal and release that was acknowledged (see the crate docs for what that
//! does and does not keep).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

/// A connection to one server or to a cluster; cheap to clone (both are multiplexed).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster {
        conn: ClusterConnection,
        /// The slot of the prefix's hash tag: where every key of this storage lives.
        slot: u16,
    },
}

impl Conn {
    /// Runs `cmd`, a command without a key, on the server that holds this storage's keys.
    pub(crate) async fn on_keys_server<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Self::Single(c) => cmd.query_async(&mut c.clone()).await,
            Self::Cluster { conn, slot } => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(*slot, SlotAddr::Master),
                ));
                let value = conn.clone().route_command(cmd, route).await?;
                T::from_redis_value(&value)
            }
        }
    }

    /// `WAIT replicas timeout` on the server of this storage's keys: how many replicas hold
    /// every write this connection sent before it.
    pub(crate) async fn wait_replicas(&self, replicas: u32, timeout: Duration) -> RedisResult<u32> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        self.on_keys_server(&cmd).await
    }

    /// The addresses (`host`, `port`) of every node of the cluster, primaries first, from
    /// `CLUSTER SLOTS`; empty on a single server or if the answer cannot be read.
    pub(crate) async fn cluster_nodes(&self) -> Vec<(String, u16)> {
        let Self::Cluster { .. } = self else {
            return Vec::new();
        };
        let Ok(Value::Array(ranges)) = self
            .on_keys_server::<Value>(redis::cmd("CLUSTER").arg("SLOTS"))
            .await
        else {
            return Vec::new();
        };
        let mut primaries = Vec::new();
        let mut replicas = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            for (i, node) in fields.into_iter().skip(2).enumerate() {
                let Value::Array(node) = node else { continue };
                let host = match node.first() {
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(Value::SimpleString(s)) => s.clone(),
                    _ => continue,
                };
                let Some(Value::Int(port)) = node.get(1) else {
                    continue;
                };
                let Ok(port) = u16::try_from(*port) else {
                    continue;
                };
                let list = if i == 0 {
                    &mut primaries
                } else {
                    &mut replicas
                };
                if !list.contains(&(host.clone(), port)) {
                    list.push((host, port));
                }
            }
        }
        primaries.extend(replicas);
        primaries
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster { conn, .. } => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster { conn, .. } => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster { conn, .. } => conn.get_db(),
        }
    }
}

/// The hash tag of `prefix` as Redis Cluster reads it: the text between the first `{` and the
/// first `}` after it, if not empty. Every key that starts with `prefix` hashes to its slot.
pub(crate) fn hash_tag(prefix: &str) -> Option<&str> {
    let open = prefix.find('{')?;
    let rest = &prefix[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn the_hash_tag_is_read_as_redis_cluster_reads_it() {
        assert_eq!(hash_tag("{locks}:"), Some("locks"));
        assert_eq!(hash_tag("app:{locks}:x{y}"), Some("locks"));
        assert_eq!(hash_tag("{}locks:"), None);
        assert_eq!(hash_tag("{locks:"), None);
        assert_eq!(hash_tag("locks:"), None);
        assert_eq!(hash_tag("}{a}"), Some("a"));
    }
}
