//! What the image tests share: the fakes' checks of an image block (valid base64, an
//! allowed media type, bytes of that type), real image bytes, and a second host on
//! loopback (not GitHub's) that serves images and records every request it got.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;

/// The most an image block may hold (the Anthropic API's limit).
pub const MAX_IMAGE_BYTES: usize = 5 << 20;

/// The bytes of base64 `data` (standard alphabet, padded), at most [`MAX_IMAGE_BYTES`].
pub fn decode_image_data(data: &str) -> Result<Vec<u8>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("invalid base64 data: {e}"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(format!("image exceeds 5 MB maximum: {} bytes", bytes.len()));
    }
    Ok(bytes)
}

/// `media_type` is one the APIs take, and `bytes` are that kind of image.
pub fn check_image_kind(media_type: &str, bytes: &[u8]) -> Result<(), String> {
    let magic: &[u8] = match media_type {
        "image/png" => b"\x89PNG\r\n\x1a\n",
        "image/jpeg" => &[0xFF, 0xD8, 0xFF],
        "image/gif" => b"GIF8",
        "image/webp" => b"RIFF",
        other => {
            return Err(format!(
                "media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp', got {other:?}"
            ))
        }
    };
    if !bytes.starts_with(magic)
        || (media_type == "image/webp" && bytes.get(8..12) != Some(b"WEBP"))
    {
        return Err(format!(
            "Image does not match the provided media type {media_type}"
        ));
    }
    Ok(())
}

/// A real PNG of `w`×`h` pixels, one colour, about `pad` bytes longer than it needs
/// (an ancillary `tEXt` chunk), so tests can make one of any size.
pub fn png(w: u32, h: u32, pad: usize) -> Vec<u8> {
    use flate2::write::ZlibEncoder;
    use std::io::Write as _;
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend((data.len() as u32).to_be_bytes());
        let mut crc_input = kind.to_vec();
        crc_input.extend_from_slice(data);
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend(crc32(&crc_input).to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    if pad > 0 {
        let mut text = b"Comment\0".to_vec();
        text.extend(std::iter::repeat_n(b'x', pad));
        chunk(&mut out, b"tEXt", &text);
    }
    // Each row: filter type 0, then its pixels.
    let mut row = vec![0u8];
    row.extend([200u8, 40, 40].repeat(w as usize));
    let raw = row.repeat(h as usize);
    let mut z = ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&raw).unwrap();
    chunk(&mut out, b"IDAT", &z.finish().unwrap());
    chunk(&mut out, b"IEND", &[]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// By name: content type and bytes.
type Files = HashMap<String, (String, Vec<u8>)>;

/// A host on loopback that is not GitHub's: serves `/{name}` from what it was given and
/// records each request's path and headers.
#[derive(Clone)]
pub struct OtherHost {
    pub url: String,
    files: Arc<Mutex<Files>>,
    seen: Arc<Mutex<Vec<(String, HeaderMap)>>>,
}

impl OtherHost {
    pub async fn start() -> OtherHost {
        let mut host = OtherHost {
            url: String::new(),
            files: Default::default(),
            seen: Default::default(),
        };
        let app = Router::new()
            .route("/{name}", get(serve))
            .with_state(host.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        host.url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        host
    }

    /// Serves `bytes` as `content_type` at `/{name}`.
    pub fn put(&self, name: &str, content_type: &str, bytes: Vec<u8>) {
        self.files
            .lock()
            .unwrap()
            .insert(name.to_string(), (content_type.to_string(), bytes));
    }

    /// Every request so far: its path and headers.
    pub fn requests(&self) -> Vec<(String, HeaderMap)> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    State(host): State<OtherHost>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    host.seen
        .lock()
        .unwrap()
        .push((format!("/{name}"), headers));
    match host.files.lock().unwrap().get(&name) {
        Some((content_type, bytes)) => {
            ([("content-type", content_type.clone())], bytes.clone()).into_response()
        }
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}
