//! AWS Signature Version 4 for DynamoDB's JSON API: every request is a `POST /` whose signed
//! headers are `content-type`, `host`, `x-amz-date`, `x-amz-target` (and
//! `x-amz-security-token` with temporary credentials).
//!
//! Why not the AWS SDK: this backend signs exactly one request shape, and the ~60 lines below
//! need only `hmac` and `sha2`, which the workspace already builds: the crate adds no
//! third-party crate to `Cargo.lock`, where `aws-sdk-dynamodb` with `aws-config` would add 29
//! (`aws-sigv4`, the `aws-smithy-*` runtime, STS, and the generated DynamoDB client itself).
//! The signer is checked against AWS's published example (the tests below).

use std::fmt;
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Credentials for signing. `Debug` shows the key id only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret: String,
    /// `AWS_SESSION_TOKEN`, for temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("key_id", &self.key_id)
            .field("secret", &"***")
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// One request to sign.
pub(crate) struct Request<'a> {
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    /// Headers other than `host` and `x-amz-date`: lower-case names.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// `(x-amz-date, authorization)` for `req`, signed for `region`/`service` at `at`.
pub(crate) fn sign(
    creds: &Credentials,
    region: &str,
    service: &str,
    req: &Request<'_>,
    at: SystemTime,
) -> (String, String) {
    let amz_date = amz_date(at);
    let day = &amz_date[..8];
    let mut headers: Vec<(&str, &str)> = req.headers.to_vec();
    headers.push(("host", req.host));
    headers.push(("x-amz-date", &amz_date));
    headers.sort_by(|a, b| a.0.cmp(b.0));
    let signed: Vec<&str> = headers.iter().map(|(name, _)| *name).collect();
    let signed = signed.join(";");
    let mut canonical = format!("{}\n{}\n{}\n", req.method, req.path, req.query);
    for (name, value) in &headers {
        canonical.push_str(&format!("{name}:{}\n", value.trim()));
    }
    canonical.push_str(&format!("\n{signed}\n{}", hex(&Sha256::digest(req.body))));
    let scope = format!("{day}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let key = signing_key(&creds.secret, day, region, service);
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        creds.key_id
    );
    (amz_date, authorization)
}

fn signing_key(secret: &str, day: &str, region: &str, service: &str) -> Vec<u8> {
    let k = hmac(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// `YYYYMMDDTHHMMSSZ` (UTC).
fn amz_date(at: SystemTime) -> String {
    let rfc3339 = humantime::format_rfc3339_seconds(at).to_string(); // 2015-08-30T12:36:00Z
    rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// AWS's worked example ("Examples of how to derive a signing key" and the IAM
    /// `ListUsers` request of the SigV4 documentation).
    #[test]
    fn matches_aws_published_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        assert_eq!(
            hex(&signing_key(secret, "20150830", "us-east-1", "iam")),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        let creds = Credentials {
            key_id: "AKIDEXAMPLE".to_owned(),
            secret: secret.to_owned(),
            session_token: None,
        };
        // 2015-08-30T12:36:00Z
        let at = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let (date, auth) = sign(
            &creds,
            "us-east-1",
            "iam",
            &Request {
                method: "GET",
                host: "iam.amazonaws.com",
                path: "/",
                query: "Action=ListUsers&Version=2010-05-08",
                headers: &[(
                    "content-type",
                    "application/x-www-form-urlencoded; charset=utf-8",
                )],
                body: b"",
            },
            at,
        );
        assert_eq!(date, "20150830T123600Z");
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let creds = Credentials {
            key_id: "AKID".to_owned(),
            secret: "s3cr3t".to_owned(),
            session_token: Some("tok3n".to_owned()),
        };
        let shown = format!("{creds:?}");
        assert!(shown.contains("AKID") && !shown.contains("s3cr3t") && !shown.contains("tok3n"));
    }
}
