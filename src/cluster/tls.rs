//! TLS for the cluster's connections: the trainer's acceptor from `[cluster.tls]`, a
//! worker's connector trusting the certificates of `--tls-ca`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::crypto::ring::default_provider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::ClusterTls;

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{}: cannot read certificates", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no certificate in it",
        path.display()
    );
    Ok(certs)
}

/// The trainer's side: its certificate chain and key.
pub fn acceptor(tls: &ClusterTls) -> anyhow::Result<TlsAcceptor> {
    let certs = certificates(&tls.cert).context("cluster.tls.cert")?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).with_context(|| {
        format!(
            "cluster.tls.key: {}: not a PEM private key",
            tls.key.display()
        )
    })?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("cluster.tls: the certificate and the key do not go together")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A worker's side: trusts the certificates in `ca` (the trainer's own, self-signed, or the
/// authority that signed it) and checks the server's name against `name`.
pub fn connector(ca: &Path, name: &str) -> anyhow::Result<(TlsConnector, ServerName<'static>)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca).context("--tls-ca")? {
        roots
            .add(cert)
            .with_context(|| format!("--tls-ca: {}: not a usable certificate", ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = ServerName::try_from(name.to_string())
        .with_context(|| format!("--tls-server-name: {name:?} is not a DNS name or IP address"))?;
    Ok((TlsConnector::from(Arc::new(config)), server))
}
