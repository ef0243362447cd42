//! Certificates made at test time for TLS tests (`rcgen`): a CA, a server certificate for
//! `127.0.0.1`/`localhost` and a client certificate, both signed by the CA.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`:
/// `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`.
///
/// # Panics
/// If a file cannot be written (a test helper).
pub fn make_certificates(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.clone().self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    for (name, sans) in [
        (
            "server",
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        ),
        ("client", vec!["client.test".to_owned()]),
    ] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
