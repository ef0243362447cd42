//! The few DynamoDB JSON-API calls the backend makes: `POST /` with `X-Amz-Target`, signed
//! with SigV4, one request per call (no retries: an outage surfaces within one timeout, and an
//! answer lost on the way is an error of unknown outcome that the engine resolves by reading).

use std::time::{Duration, SystemTime};

use serde_json::Value;
use storage_lock_core::StorageError;

use crate::NAME;
use crate::sigv4::{self, Credentials};

/// A refusal from the service: its exception name (without the namespace) and body.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub kind: String,
    pub body: Value,
}

impl Refusal {
    pub fn is(&self, kind: &str) -> bool {
        self.kind == kind
    }

    /// For an error: the exception and the first sentence of its message. A signature error's
    /// message can go on to quote the canonical request, session token included: that part is
    /// never kept.
    pub fn into_error(self, operation: &'static str) -> StorageError {
        let message = self
            .body
            .get("message")
            .or_else(|| self.body.get("Message"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let reason = format!("{}: {}", self.kind, first_part(message));
        match self.kind.as_str() {
            "AccessDeniedException"
            | "IncompleteSignatureException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "MissingAuthenticationTokenException"
            | "ExpiredTokenException" => StorageError::Denied {
                backend: NAME.to_owned(),
                reason,
            },
            _ => StorageError::backend(NAME, operation, reason),
        }
    }
}

/// A service message up to its first line break, its first mention of the canonical request
/// or string to sign, and at most 300 bytes.
fn first_part(message: &str) -> &str {
    let mut end = message.len().min(300);
    for stop in [
        "\n",
        "The Canonical",
        "Canonical String",
        "String-to-Sign",
        "x-amz-security-token",
    ] {
        if let Some(at) = message.find(stop) {
            end = end.min(at);
        }
    }
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].trim_end()
}

pub(crate) struct Client {
    http: reqwest::Client,
    /// `scheme://host[:port]/`.
    url: String,
    host: String,
    region: String,
    creds: Credentials,
}

impl Client {
    pub fn new(
        endpoint: &str,
        region: &str,
        creds: Credentials,
        timeout: Duration,
    ) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::config(NAME, reason);
        let (scheme, rest) = endpoint
            .split_once("://")
            .filter(|(s, _)| *s == "http" || *s == "https")
            .ok_or_else(|| {
                invalid(format!(
                    "endpoint must be http(s)://host[:port], not {endpoint:?}"
                ))
            })?;
        // reqwest sends the host lower-cased: sign it so.
        let host = rest.trim_end_matches('/').to_ascii_lowercase();
        let host = host.as_str();
        // The Host header leaves out the scheme's default port, so the signature must too.
        let host = match scheme {
            "https" => host.strip_suffix(":443").unwrap_or(host),
            _ => host.strip_suffix(":80").unwrap_or(host),
        };
        if host.is_empty() || host.contains(['/', '?', '#', '@']) {
            return Err(invalid(format!(
                "endpoint must be http(s)://host[:port], not {endpoint:?}"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| StorageError::backend(NAME, "open", e))?;
        Ok(Self {
            http,
            url: format!("{scheme}://{host}/"),
            host: host.to_owned(),
            region: region.to_owned(),
            creds,
        })
    }

    /// `DynamoDB_20120810.{action}` with `body`: the answer's JSON, or the service's refusal.
    pub async fn call(
        &self,
        operation: &'static str,
        action: &str,
        body: &Value,
    ) -> Result<Result<Value, Refusal>, StorageError> {
        let failed = |e: String| StorageError::backend(NAME, operation, e);
        let body = serde_json::to_vec(body).map_err(|e| failed(e.to_string()))?;
        let target = format!("DynamoDB_20120810.{action}");
        let mut headers = vec![
            ("content-type", "application/x-amz-json-1.0"),
            ("x-amz-target", target.as_str()),
        ];
        if let Some(token) = &self.creds.session_token {
            headers.push(("x-amz-security-token", token.as_str()));
        }
        let (date, authorization) = sigv4::sign(
            &self.creds,
            &self.region,
            "dynamodb",
            &sigv4::Request {
                method: "POST",
                host: &self.host,
                path: "/",
                query: "",
                headers: &headers,
                body: &body,
            },
            SystemTime::now(),
        );
        let mut request = self
            .http
            .post(&self.url)
            .header("x-amz-date", date)
            .header("authorization", authorization);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| failed(without_url(e)))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| failed(without_url(e)))?;
        let json: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| failed(format!("HTTP {status}, not JSON: {e}")))?
        };
        if status.is_success() {
            return Ok(Ok(json));
        }
        let kind = json
            .get("__type")
            .and_then(Value::as_str)
            .map(|t| t.rsplit('#').next().unwrap_or(t).to_owned());
        match kind {
            Some(kind) if status.is_client_error() => Ok(Err(Refusal { kind, body: json })),
            Some(kind) => Err(failed(format!("HTTP {status}: {kind}"))),
            None => Err(failed(format!("HTTP {status}"))),
        }
    }
}

/// A transport error's text without its URL (the endpoint is in the configuration already).
fn without_url(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    match std::error::Error::source(&e) {
        Some(source) => format!("{kind}: {source}"),
        None => kind.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a signature error may quote after its first sentence never reaches an error.
    #[test]
    fn service_messages_are_cut_before_any_quoted_request() {
        let quoted = "The request signature we calculated does not match the signature you \
                      provided.\n\nThe Canonical String for this request should have been\n\
                      'POST\n/\n\nx-amz-security-token:SECRET\n'";
        let e = Refusal {
            kind: "InvalidSignatureException".to_owned(),
            body: serde_json::json!({ "message": quoted }),
        }
        .into_error("get");
        let shown = e.to_string();
        assert!(matches!(e, StorageError::Denied { .. }), "{e:?}");
        assert!(
            shown.contains("does not match") && !shown.contains("SECRET"),
            "{shown}"
        );
        assert_eq!(first_part("short"), "short");
        assert_eq!(first_part(&"é".repeat(400)).len(), 300);
    }

    /// The signed host is what reqwest sends: lower case, without the scheme's default port.
    #[test]
    fn the_signed_host_is_the_one_sent() {
        let creds = Credentials {
            key_id: "a".to_owned(),
            secret: "b".to_owned(),
            session_token: None,
        };
        let t = Duration::from_secs(1);
        let https = Client::new(
            "https://DynamoDB.eu-west-1.amazonaws.com:443/",
            "eu-west-1",
            creds.clone(),
            t,
        )
        .unwrap();
        assert_eq!(https.host, "dynamodb.eu-west-1.amazonaws.com");
        assert_eq!(https.url, "https://dynamodb.eu-west-1.amazonaws.com/");
        let http = Client::new("http://127.0.0.1:4570", "us-east-1", creds.clone(), t).unwrap();
        assert_eq!(http.host, "127.0.0.1:4570");
        for bad in ["ftp://h", "http://", "http://u@h", "h:1", "http://h/path"] {
            assert!(Client::new(bad, "r", creds.clone(), t).is_err(), "{bad}");
        }
    }
}
