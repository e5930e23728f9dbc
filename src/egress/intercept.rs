//! A `CONNECT` tunnel of a sandbox whose run injects secrets on the wire ([`super::inject`]):
//! whoever speaks first decides. A client whose first byte opens a TLS handshake (0x16)
//! gets the proxy's own TLS, with a leaf for the `CONNECT` host signed by the run's CA and
//! `http/1.1` as the only protocol; its HTTP/1.1 requests are read by hyper, have their
//! placeholders replaced (or are refused), and go upstream over the proxy's own TLS, whose
//! certificate is checked against the upstream roots (a bad one is a `502` saying so, never
//! a connection without the check). Anything else (another first byte, or a server that
//! speaks first) is tunnelled raw, as without secrets.
//!
//! Bodies stream through in both directions; each request head is bounded as the proxy's
//! own are. The upstream TCP connection opened for the `CONNECT` carries the first upstream
//! TLS connection; when the upstream closes it, the next request opens another through the
//! same checks.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::upgrade::Upgraded;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::inject::Injector;
use super::reply::{text, Body, CONNECT_TIMEOUT, HEADER_TIMEOUT, MAX_HEAD_BYTES};

/// Opens another TCP connection to the tunnel's upstream, through the proxy's checks.
pub(crate) type Reconnect = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<TcpStream, Response<Body>>> + Send>>
        + Send
        + Sync,
>;
/// Records a refused request with its reason.
pub(crate) type Record = Arc<dyn Fn(&str) + Send + Sync>;

/// One tunnel: where it goes and what it may do there.
pub(crate) struct Tunnel {
    pub injector: Arc<Injector>,
    /// Normalized, as the `CONNECT` named it.
    pub host: String,
    pub port: u16,
    pub reconnect: Reconnect,
    pub record: Record,
}

/// Serves the tunnel until either side ends it.
pub(crate) async fn serve(tunnel: Tunnel, client: Upgraded, mut upstream: TcpStream) {
    let mut client = TokioIo::new(client);
    let mut first = [0u8; 1];
    let client_first = tokio::select! {
        read = client.read(&mut first) => match read {
            Ok(0) | Err(_) => return,
            Ok(_) => true,
        },
        _ = upstream.readable() => false,
    };
    if !client_first || first[0] != 0x16 {
        if client_first && upstream.write_all(&first).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    let config = match tunnel.injector.server_config(&tunnel.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(host = %tunnel.host, "egress proxy: no leaf certificate: {e}");
            return;
        }
    };
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(Rewind {
        first: Some(first[0]),
        inner: client,
    });
    let tls = match tokio::time::timeout(HEADER_TIMEOUT, accept).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(host = %tunnel.host, "egress proxy: the sandbox's TLS failed: {e}");
            return;
        }
        Err(_) => return,
    };
    let tunnel = Arc::new(tunnel);
    let upstream = Arc::new(tokio::sync::Mutex::new(Upstream {
        first: Some(upstream),
        sender: None,
    }));
    let service = hyper::service::service_fn(move |req| {
        let (tunnel, upstream) = (tunnel.clone(), upstream.clone());
        async move { Ok::<_, Infallible>(tunnel.exchange(req, &upstream).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("egress proxy: an intercepted connection ended: {e}");
    }
}

/// The upstream side of one tunnel: the TCP connection the `CONNECT` opened until it is
/// used, then the HTTP/1.1 sender over TLS.
struct Upstream {
    first: Option<TcpStream>,
    sender: Option<SendRequest<Incoming>>,
}

impl Tunnel {
    /// One request: placeholders replaced or the request refused, then sent upstream.
    async fn exchange(
        &self,
        req: Request<Incoming>,
        upstream: &tokio::sync::Mutex<Upstream>,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let target = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".to_string());
        if let Err(refused) =
            self.injector
                .apply(&self.host, self.port, &target, &mut parts.headers)
        {
            (self.record)(&refused.why);
            return text(
                StatusCode::FORBIDDEN,
                &refused.message(&self.host, self.port),
            );
        }
        parts.uri = match target.parse() {
            Ok(u) => u,
            Err(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "kodx egress proxy: a bad request target\n",
                )
            }
        };
        if !parts.headers.contains_key(hyper::header::HOST) {
            let authority = match (self.host.contains(':'), self.port) {
                (true, p) => format!("[{}]:{p}", self.host),
                (false, 443) => self.host.clone(),
                (false, p) => format!("{}:{p}", self.host),
            };
            if let Ok(v) = authority.parse() {
                parts.headers.insert(hyper::header::HOST, v);
            }
        }
        let mut upstream = upstream.lock().await;
        let sender = match self.ready(&mut upstream).await {
            Ok(s) => s,
            Err(answer) => return answer,
        };
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut head, body) = resp.into_parts();
                self.injector.scrub(&mut head.headers);
                Response::from_parts(head, body.boxed())
            }
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "kodx egress proxy: {}:{} failed: {e}\n",
                    self.host, self.port
                ),
            ),
        }
    }

    /// The sender, opening (again) the upstream's TLS connection when there is none or the
    /// last one closed.
    async fn ready<'u>(
        &self,
        upstream: &'u mut Upstream,
    ) -> Result<&'u mut SendRequest<Incoming>, Response<Body>> {
        if let Some(mut s) = upstream.sender.take() {
            if s.ready().await.is_ok() {
                return Ok(upstream.sender.insert(s));
            }
        }
        let tcp = match upstream.first.take() {
            Some(tcp) => tcp,
            None => (self.reconnect)().await?,
        };
        let sender = self.handshake(tcp).await?;
        Ok(upstream.sender.insert(sender))
    }

    async fn handshake(&self, tcp: TcpStream) -> Result<SendRequest<Incoming>, Response<Body>> {
        let (host, port) = (&self.host, self.port);
        let gateway = |why: String| {
            text(
                StatusCode::BAD_GATEWAY,
                &format!("kodx egress proxy: {host}:{port}: {why}\n"),
            )
        };
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|_| gateway("not a name a TLS server can have".to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(self.injector.client_config());
        let tls = match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                return Err(gateway(format!(
                    "the TLS connection failed: {e} (the proxy checks every server's \
                     certificate against the system's trusted roots and sends nothing to a \
                     server it cannot trust)"
                )))
            }
            Err(_) => {
                return Err(gateway(
                    "the TLS handshake did not finish within 5 s".to_string(),
                ))
            }
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| gateway(format!("the HTTP connection failed: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// The client's stream with the byte already read put back in front.
struct Rewind<T> {
    first: Option<u8>,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(b) = self.first.take() {
                buf.put_slice(&[b]);
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
