//! The one TLS setup of every `/readyz` probe: rustls (ring) trusting only the cluster CA, and
//! the one reader of that CA from a PEM file.

use std::path::Path;
use std::sync::Arc;

/// Why a cluster CA file is not usable.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{0}")]
    Read(#[source] std::io::Error),
    #[error("not a PEM certificate file: {0}")]
    Pem(#[source] std::io::Error),
    #[error("no PEM certificate in the file")]
    Empty,
}

/// The certificates of a PEM file, as DER (at least one).
pub fn read_ca(path: &Path) -> Result<Vec<Vec<u8>>, CaError> {
    let bytes = std::fs::read(path).map_err(CaError::Read)?;
    let mut reader = std::io::BufReader::new(bytes.as_slice());
    let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut reader)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(CaError::Pem)?;
    if certs.is_empty() {
        return Err(CaError::Empty);
    }
    Ok(certs)
}

/// A rustls client configuration (ring) that trusts only `ca_der`.
pub fn client_config(ca_der: &[Vec<u8>]) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for der in ca_der {
        roots.add(rustls::pki_types::CertificateDer::from(der.clone()))?;
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
