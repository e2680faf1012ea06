//! The trainer's cluster listener. It binds the configured address itself, so port 0 works
//! and the address actually bound can be printed for workers, and it runs each TLS handshake
//! in a task of its own under a deadline. ractor_cluster's own listener does neither: it does
//! not tell which port it chose, and it awaits each handshake before accepting the next
//! connection, so one peer that connects and stays silent would keep every worker out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use ractor_cluster::{NetworkStream, NodeServerMessage};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// How long a peer has to finish its TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes under way at once; a connection beyond that is closed at once.
pub(crate) const MAX_HANDSHAKES: usize = 64;
/// The pause after a failed `accept` (out of file descriptors, say) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections for a node server until dropped.
pub(crate) struct Listener {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Listener {
    /// Binds `addr` (port 0: any free port) and hands each accepted connection, after its
    /// TLS handshake where `tls` is set, to `server`.
    pub(crate) async fn start(
        addr: SocketAddr,
        server: ActorRef<NodeServerMessage>,
        tls: Option<TlsAcceptor>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept_loop(listener, server, tls));
        Ok(Self { addr, task })
    }

    /// The address bound.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    server: ActorRef<NodeServerMessage>,
    tls: Option<TlsAcceptor>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("cluster: accepting a connection failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let Some(acceptor) = &tls else {
            open(
                &server,
                NetworkStream::Raw {
                    peer_addr: peer,
                    local_addr: local,
                    stream,
                },
            );
            continue;
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            refused(
                &format!("{MAX_HANDSHAKES} TLS handshakes are already under way"),
                peer,
            );
            continue;
        };
        let (acceptor, server) = (acceptor.clone(), server.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match handshake(&acceptor, stream, HANDSHAKE_TIMEOUT).await {
                Ok(stream) => open(
                    &server,
                    NetworkStream::TlsServer {
                        peer_addr: peer,
                        local_addr: local,
                        stream,
                    },
                ),
                Err(why) => refused(&why, peer),
            }
        });
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    within: Duration,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("its TLS handshake failed ({e})")),
        Err(_) => Err(format!(
            "it did not finish its TLS handshake within {within:?}"
        )),
    }
}

fn open(server: &ActorRef<NodeServerMessage>, stream: NetworkStream) {
    let _ = server.cast(NodeServerMessage::ConnectionOpened {
        stream: Box::new(stream),
        is_server: true,
    });
}

fn refused(why: &str, peer: SocketAddr) {
    metrics::counter!(crate::metric_names::CLUSTER_REFUSED_TOTAL.name).increment(1);
    eprintln!("cluster: connection from {peer} refused: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::{ClientHello, ResolvesServerCert};
    use rustls::sign::CertifiedKey;
    use tokio::io::AsyncWriteExt;

    /// A server without a certificate: enough to reach, or fail, a handshake's first step.
    #[derive(Debug)]
    struct NoCertificate;

    impl ResolvesServerCert for NoCertificate {
        fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }

    fn acceptor() -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(NoCertificate));
        TlsAcceptor::from(Arc::new(config))
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn a_peer_that_stays_silent_is_cut_off_at_the_deadline() {
        let (_silent, server) = pair().await;
        let why = handshake(&acceptor(), server, Duration::from_millis(20))
            .await
            .expect_err("nothing was sent, so no handshake can finish");
        assert_eq!(why, "it did not finish its TLS handshake within 20ms");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_speak_tls_is_refused_with_the_reason() {
        let (mut plain, server) = pair().await;
        plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let why = handshake(&acceptor(), server, Duration::from_secs(3600))
            .await
            .expect_err("not a TLS client hello");
        assert!(why.starts_with("its TLS handshake failed ("), "{why}");
    }
}
