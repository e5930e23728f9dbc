//! What the egress proxy's parts share: the body type of its answers, its own answers, and
//! the bounds every HTTP exchange it serves keeps.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::{Response, StatusCode};

/// A request head must arrive within this.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// An upstream connection (TCP, and TLS on top) must open within this.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A request head is at most this long.
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

pub(crate) fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// The proxy's own answer: `status` and a line of text.
pub(crate) fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
