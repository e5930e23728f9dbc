//! The fake GitHub's attachments: `GET /user-attachments/assets/{id}` on its web side, as
//! github.com serves the images pasted into an issue. An asset is bytes (served to a
//! request carrying an installation token of the fake, as a private repository's are), or
//! a redirect (github.com sends an attachment on to its asset host). Every request is
//! recorded with its `Authorization` like any other (`FakeGitHub::requests`).

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};

use super::{token_installation, FakeGitHub, Req};

/// One attachment.
#[derive(Clone, Debug)]
pub enum Asset {
    Bytes {
        content_type: String,
        bytes: Vec<u8>,
    },
    /// `302 Found` to this address.
    Redirect(String),
}

pub(super) type Assets = HashMap<String, Asset>;

impl FakeGitHub {
    /// Serves `bytes` as `content_type` at the returned address (on the web side).
    pub fn put_asset(&self, id: &str, content_type: &str, bytes: Vec<u8>) -> String {
        let asset = Asset::Bytes {
            content_type: content_type.to_string(),
            bytes,
        };
        self.state().assets.insert(id.to_string(), asset);
        self.asset_url(id)
    }

    /// Answers the returned address with a redirect to `location`.
    pub fn redirect_asset(&self, id: &str, location: &str) -> String {
        let asset = Asset::Redirect(location.to_string());
        self.state().assets.insert(id.to_string(), asset);
        self.asset_url(id)
    }

    /// Where asset `id` is: `{root}/user-attachments/assets/{id}`.
    pub fn asset_url(&self, id: &str) -> String {
        format!("{}/user-attachments/assets/{id}", self.root())
    }
}

pub(super) async fn get_asset(
    State(fake): State<FakeGitHub>,
    Path(id): Path<String>,
    req: Req,
) -> Response {
    if let Err(refused) = token_installation(&fake, &req) {
        return refused;
    }
    let asset = fake.state().assets.get(&id).cloned();
    match asset {
        Some(Asset::Bytes {
            content_type,
            bytes,
        }) => ([("content-type", content_type)], bytes).into_response(),
        Some(Asset::Redirect(to)) => {
            (axum::http::StatusCode::FOUND, [("location", to)], "").into_response()
        }
        None => (axum::http::StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}
