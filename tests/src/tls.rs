//! Test certificates, made when a test runs (no private key is ever committed): a CA
//! and a leaf for `localhost` and `127.0.0.1` that it signs, written as PEM files for
//! keypool's `tls_cert_file`/`tls_key_file` and for clients' `--cacert`; and a TLS
//! client connection that trusts that CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A test CA and one leaf it signed, as PEM files in a folder.
#[derive(Debug)]
pub struct TestCertificates {
    /// The CA certificate (what clients trust).
    pub ca: PathBuf,
    /// The leaf's chain (leaf, then the CA): `tls_cert_file`.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8): `tls_key_file`.
    pub key: PathBuf,
}

impl TestCertificates {
    /// A fresh CA named `name` and a leaf for `localhost` and `127.0.0.1`, written as
    /// `{prefix}ca.pem`, `{prefix}cert.pem`, `{prefix}key.pem` in `dir`.
    ///
    /// # Panics
    /// When a certificate cannot be made or written.
    pub fn create(dir: &Path, prefix: &str, name: &str) -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, name.to_owned());
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let mut leaf_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let leaf = leaf_params
            .signed_by(&leaf_key, &ca)
            .expect("leaf certificate");
        let certs = Self {
            ca: dir.join(format!("{prefix}ca.pem")),
            cert: dir.join(format!("{prefix}cert.pem")),
            key: dir.join(format!("{prefix}key.pem")),
        };
        std::fs::write(&certs.ca, ca.pem()).expect("write the CA");
        std::fs::write(&certs.cert, format!("{}{}", leaf.pem(), ca.pem()))
            .expect("write the chain");
        std::fs::write(&certs.key, leaf_key.serialize_pem()).expect("write the key");
        certs
    }

    /// Copies this leaf's chain and key over `cert` and `key` (as an operator renews a
    /// certificate in place before `SIGHUP`).
    ///
    /// # Panics
    /// When a file cannot be copied.
    pub fn install_as(&self, cert: &Path, key: &Path) {
        std::fs::copy(&self.cert, cert).expect("copy the chain");
        std::fs::copy(&self.key, key).expect("copy the key");
    }

    /// A rustls client configuration that trusts only this CA, offering `alpn`.
    ///
    /// # Panics
    /// When the CA cannot be read.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(&self.ca).expect("read the CA")
        {
            roots
                .add(cert.expect("a CA certificate"))
                .expect("add the CA");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A TLS connection to `127.0.0.1:port` trusting only this CA, offering `alpn`.
    ///
    /// # Errors
    /// When the connection or the handshake fails (e.g. keypool serves a certificate of
    /// another CA).
    pub async fn connect(
        &self,
        port: u16,
        alpn: &[&[u8]],
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let connector = tokio_rustls::TlsConnector::from(self.client_config(alpn));
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let name = ServerName::try_from("localhost").expect("a server name");
        connector.connect(name, tcp).await
    }
}
