//! TLS termination of the public listener (`server.tls_cert_file`, `tls_key_file`):
//! rustls with ring, ALPN `h2` and `http/1.1`, and a certificate that `SIGHUP` reloads
//! without dropping a connection (new handshakes get the new certificate).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::ProxyError;

/// The certificate and key of the public listener, reloadable. Cheap to clone.
#[derive(Clone)]
pub struct TlsCertificates {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Resolver>,
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCertificates")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

impl TlsCertificates {
    /// Reads the PEM certificate chain and private key.
    ///
    /// # Errors
    /// [`ProxyError::Tls`] naming the file and what is wrong with it (never key bytes).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, ProxyError> {
        let certified = read_certified_key(cert, key)?;
        let current = Arc::new(Resolver(RwLock::new(Arc::new(certified))));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ProxyError::Tls(format!("rustls refuses its protocol versions: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current,
            config: Arc::new(config),
        })
    }

    /// Reads the files again; on success new handshakes use them, on failure the
    /// current certificate stays (connections are never dropped either way).
    ///
    /// # Errors
    /// As [`TlsCertificates::load`].
    pub fn reload(&self) -> Result<(), ProxyError> {
        let certified = read_certified_key(&self.cert, &self.key)?;
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(certified);
        Ok(())
    }

    /// The acceptor for new connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

fn read_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, ProxyError> {
    let problem = |file: &Path, what: &str| ProxyError::Tls(format!("{}: {what}", file.display()));
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| problem(cert, &format!("cannot read the certificate file: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(cert, &format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(problem(cert, "no CERTIFICATE block in the file"));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        problem(
            key,
            &format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
        )
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| problem(key, &format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| problem(key, &format!("the key does not match the certificate: {e}")))?;
    Ok(certified)
}
