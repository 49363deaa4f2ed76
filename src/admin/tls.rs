//! The metrics server's TLS: a certificate chain and key from files (cert-manager, the
//! operator's own CA), or a self-signed certificate made at start, as controller-runtime does
//! without a certificate directory (Prometheus then scrapes with `insecureSkipVerify`, relying
//! on the bearer token's authorisation, not on the server's identity).

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate without a key, or a key without a certificate.
    #[error("--{given} needs --{missing} too")]
    Half {
        given: &'static str,
        missing: &'static str,
    },
    /// A file cannot be read or holds no PEM item of its kind.
    #[error("reading {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The self-signed certificate cannot be made.
    #[error("making a self-signed certificate: {0}")]
    SelfSigned(String),
    /// rustls refuses the certificate and key.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The server configuration: `cert` + `key` (PEM files) when given, else a self-signed
/// certificate for `names` (host names or IP addresses). ALPN: HTTP/1.1.
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = match (cert, key) {
        (Some(cert), Some(key)) => (read_chain(cert)?, read_key(key)?),
        (Some(_), None) => {
            return Err(TlsError::Half {
                given: "metrics-tls-cert",
                missing: "metrics-tls-key",
            });
        }
        (None, Some(_)) => {
            return Err(TlsError::Half {
                given: "metrics-tls-key",
                missing: "metrics-tls-cert",
            });
        }
        (None, None) => self_signed(names)?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

type Chain = Vec<rustls::pki_types::CertificateDer<'static>>;
type Key = rustls::pki_types::PrivateKeyDer<'static>;

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn read_chain(path: &Path) -> Result<Chain, TlsError> {
    let pem = read("certificate", path)?;
    let chain: Chain = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read {
            what: "certificate",
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Read {
            what: "certificate",
            path: path.to_owned(),
            reason: "no PEM certificate in it".into(),
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<Key, TlsError> {
    let pem = read("key", path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| TlsError::Read {
            what: "key",
            path: path.to_owned(),
            reason: e.to_string(),
        })?
        .ok_or_else(|| TlsError::Read {
            what: "key",
            path: path.to_owned(),
            reason: "no PEM private key in it".into(),
        })
}

fn self_signed(names: &[String]) -> Result<(Chain, Key), TlsError> {
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    // A name rcgen cannot put in a certificate (a host name with `_`, say) is left out: nobody
    // verifies a self-signed certificate's names anyway.
    let usable: Vec<String> = names
        .iter()
        .filter(|n| rcgen::CertificateParams::new(vec![(*n).clone()]).is_ok())
        .cloned()
        .collect();
    let mut params = rcgen::CertificateParams::new(if usable.is_empty() {
        vec!["localhost".to_owned()]
    } else {
        usable
    })
    .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "baton metrics (self-signed)");
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    Ok((vec![cert.der().clone()], Key::Pkcs8(der)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made_without_files_and_half_a_pair_is_refused() {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let config = server_config(None, None, &names).unwrap();
        assert!(server_config(None, None, &["not a name!".to_owned()]).is_ok());
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "not a certificate").unwrap();
        let err = server_config(Some(&cert), None, &names).unwrap_err();
        assert_eq!(err.to_string(), "--metrics-tls-cert needs --metrics-tls-key too");
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "").unwrap();
        let err = server_config(Some(&cert), Some(&key), &names).unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }

    #[test]
    fn a_certificate_and_key_from_files_are_used() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["metrics.example".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        assert!(server_config(Some(&c), Some(&k), &[]).is_ok());
    }
}
