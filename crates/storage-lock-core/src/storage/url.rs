//! The one URL vocabulary of every backend builder's `from_url`:
//!
//! * [`UrlParts`]: a backend URL of the form
//!   `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…]`, for backends
//!   whose drivers take no URL of their own (etcd, NATS, object storage): several hosts,
//!   percent-decoded credentials and options, and a check that every option was understood;
//! * [`DriverUrl`]: a URL for a driver that takes one (PostgreSQL, MySQL, Redis): storage-lock's
//!   options taken off, the driver's own passed through untouched, anything else refused;
//! * the options every backend spells alike: `durability` ([`allow_volatile`]), `timeout`
//!   ([`parse_duration`]), `prefix` or `table` for where records live.

use std::time::Duration;

/// A parsed backend URL. `Debug` hides the password.
///
/// # Examples
/// ```
/// use storage_lock_core::storage::url::UrlParts;
/// let mut u = UrlParts::parse("nats://me:p%40ss@h1:4222,h2:4222?bucket=locks&timeout=2s")?;
/// assert_eq!(u.hosts, ["h1:4222", "h2:4222"]);
/// assert_eq!(u.password.as_deref(), Some("p@ss"));
/// assert_eq!(u.take("bucket").as_deref(), Some("locks"));
/// assert_eq!(u.take_duration("timeout")?, Some(std::time::Duration::from_secs(2)));
/// u.finish(&["bucket", "timeout"])?;
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UrlParts {
    /// The scheme, lower-cased.
    pub scheme: String,
    /// The user name, if any.
    pub user: Option<String>,
    /// The password, if any.
    pub password: Option<String>,
    /// `host[:port]` entries, in order (none for `scheme:///path`).
    pub hosts: Vec<String>,
    /// The path after the hosts, without its leading `/` (percent-decoded).
    pub path: String,
    /// Options not taken yet, in order.
    pub params: Vec<(String, String)>,
}

impl std::fmt::Debug for UrlParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlParts")
            .field("scheme", &self.scheme)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("params", &self.params)
            .finish()
    }
}

impl UrlParts {
    /// Splits `url` into its parts.
    ///
    /// # Errors
    /// A message (never containing the password) for a missing `://`, an empty host in a
    /// list, or bad percent-encoding.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "expected scheme://…".to_owned())?;
        if rest.contains('#') {
            return Err("a URL fragment (#…) is not allowed; percent-encode '#' as %23".to_owned());
        }
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority_part, path_part) =
            before_query.split_once('/').unwrap_or((before_query, ""));
        if !authority_part.contains('@') && (path_part.contains('@') || query.contains('@')) {
            // Most likely a password with a raw '/', '?' or '@': never echo any of it.
            return Err(
                "'@' after the host: percent-encode it (%40), and '/', '?', '#' and '@' in a user \
                 name or password (%2F, %3F, %23, %40)"
                    .to_owned(),
            );
        }
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let mut parts = Self {
            scheme: scheme.to_ascii_lowercase(),
            path: percent_decode(path)?,
            ..Self::default()
        };
        let hosts = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                parts.user = Some(percent_decode(user)?);
                parts.password = password.map(percent_decode).transpose()?;
                hosts
            }
            None => authority,
        };
        if !hosts.is_empty() {
            for host in hosts.split(',') {
                if host.is_empty() || host.contains(char::is_whitespace) {
                    return Err(format!("bad host {host:?} in the host list"));
                }
                parts.hosts.push(host.to_owned());
            }
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            parts.params.push((percent_decode(k)?, percent_decode(v)?));
        }
        Ok(parts)
    }

    /// Removes option `name` and returns its (last) value.
    pub fn take(&mut self, name: &str) -> Option<String> {
        take_param(&mut self.params, name)
    }

    /// [`Self::take`] as a duration (`500ms`, `2s`, `1m`; not zero).
    ///
    /// # Errors
    /// A message naming the option for anything else.
    pub fn take_duration(&mut self, name: &str) -> Result<Option<Duration>, String> {
        self.take(name)
            .map(|v| {
                parse_duration(&v)
                    .ok_or_else(|| format!("bad {name} {v:?} (a number with ms, s or m: 2s)"))
            })
            .transpose()
    }

    /// `Ok` if every option was taken; else a message naming the first unknown one and the
    /// `known` ones.
    ///
    /// # Errors
    /// As described.
    pub fn finish(self, known: &[&str]) -> Result<(), String> {
        match self.params.first() {
            None => Ok(()),
            Some((k, _)) => Err(format!(
                "unknown option {k:?} (known: {})",
                known.join(", ")
            )),
        }
    }
}

/// A URL for a driver that parses URLs itself, split into what the driver gets and
/// storage-lock's own options (percent-decoded, in order).
///
/// # Examples
/// ```
/// use storage_lock_core::storage::url::DriverUrl;
/// let mut u = DriverUrl::split(
///     "postgres://u:p%40ss@h/db?sslmode=disable&table=locks",
///     &["table", "durability"],
///     &["sslmode"],
/// )?;
/// assert_eq!(u.driver, "postgres://u:p%40ss@h/db?sslmode=disable");
/// assert_eq!(u.take("table").as_deref(), Some("locks"));
/// assert!(DriverUrl::split("redis://h/?tabel=x", &["prefix"], &[]).is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverUrl {
    /// The URL for the driver: the original without storage-lock's options.
    pub driver: String,
    /// storage-lock's options not taken yet, percent-decoded, in order.
    pub ours: Vec<(String, String)>,
}

impl std::fmt::Debug for DriverUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverUrl")
            .field("driver", &super::redact_url(&self.driver))
            .field("ours", &self.ours)
            .finish()
    }
}

impl DriverUrl {
    /// Takes the options named in `ours` off `url`; keeps those in `driver` for the driver.
    ///
    /// # Errors
    /// A message naming an option that is in neither list (a misspelled option is never
    /// silently ignored), or bad percent-encoding. Never contains the password.
    pub fn split(url: &str, ours: &[&str], driver: &[&str]) -> Result<Self, String> {
        if url.contains('#') {
            return Err("a URL fragment (#…) is not allowed; percent-encode '#' as %23".to_owned());
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut kept, mut taken) = (Vec::new(), Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(k)?;
            if ours.contains(&name.as_str()) {
                taken.push((name, percent_decode(v)?));
            } else if driver.contains(&name.as_str()) {
                kept.push(pair);
            } else {
                let known = ours.iter().chain(driver).copied().collect::<Vec<_>>();
                return Err(format!(
                    "unknown option {name:?} (known: {})",
                    known.join(", ")
                ));
            }
        }
        let driver = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(Self {
            driver,
            ours: taken,
        })
    }

    /// Removes storage-lock's option `name` and returns its (last) value.
    pub fn take(&mut self, name: &str) -> Option<String> {
        take_param(&mut self.ours, name)
    }
}

/// Removes every `name` option from `params`; the last one's value.
fn take_param(params: &mut Vec<(String, String)>, name: &str) -> Option<String> {
    let mut found = None;
    params.retain(|(k, v)| {
        if k == name {
            found = Some(v.clone());
            false
        } else {
            true
        }
    });
    found
}

/// The `durability` option: `volatile` accepts a server that can forget acknowledged writes
/// (`true`); `durable` (the default) and `unverified` do not (`unverified` opens as the default
/// does and tells tools that the operator made sure of settings the backend cannot read).
///
/// # Errors
/// A message for any other value.
pub fn allow_volatile(value: &str) -> Result<bool, String> {
    match value {
        "volatile" => Ok(true),
        "durable" | "unverified" => Ok(false),
        other => Err(format!(
            "durability must be durable, unverified or volatile, not {other:?}"
        )),
    }
}

/// `2s`, `500ms`, `1m` as a non-zero duration.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        _ => return None,
    };
    (!d.is_zero()).then_some(d)
}

/// `s` with every `%XX` replaced by the byte it encodes (a URL's path or option value).
///
/// # Errors
/// A `%` not followed by two hex digits, or bytes that are not UTF-8 once decoded.
///
/// # Examples
/// ```
/// use storage_lock_core::storage::url::percent_decode;
/// assert_eq!(percent_decode("/tmp/a%23b.db").unwrap(), "/tmp/a#b.db");
/// assert!(percent_decode("/tmp/100%.db").is_err());
/// ```
pub fn percent_decode(s: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let digit = |c: Option<u8>| c.and_then(|c| char::from(c).to_digit(16));
            match (digit(bytes.next()), digit(bytes.next())) {
                (Some(h), Some(l)) => out.push(u8::try_from(h * 16 + l).unwrap_or(0)),
                _ => return Err("bad percent-encoding in the URL".to_owned()),
            }
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| "the URL decodes to invalid UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_awkward_urls() {
        let u = UrlParts::parse("s3://bucket/some/dir?endpoint=http%3A%2F%2Fh%3A1").unwrap();
        assert_eq!(u.hosts, ["bucket"]);
        assert_eq!(u.path, "some/dir");
        assert_eq!(u.params, [("endpoint".into(), "http://h:1".into())]);
        let u = UrlParts::parse("etcd://u@h").unwrap();
        assert_eq!((u.user.as_deref(), u.password), (Some("u"), None));
        assert!(UrlParts::parse("etcd://h1,,h2").is_err());
        assert!(UrlParts::parse("etcd:h").is_err());
        assert!(UrlParts::parse("etcd://u:%zz@h").is_err());
        for leaky in [
            "etcd://u:se?CRET@h",
            "etcd://u:se/CRET@h",
            "etcd://u:se#CRET@h",
        ] {
            let e = UrlParts::parse(leaky).unwrap_err();
            assert!(!e.contains("CRET"), "{e}");
        }
        let e = UrlParts::parse("x://u:secret@h?z=1").unwrap();
        assert!(!format!("{e:?}").contains("secret"));
        assert!(e.finish(&["a"]).unwrap_err().contains("\"z\""));
        for (s, d) in [
            ("1m", Some(60_000)),
            ("0s", None),
            ("5", None),
            ("2h", None),
        ] {
            assert_eq!(parse_duration(s).map(|d| d.as_millis()), d, "{s}");
        }
    }
}
