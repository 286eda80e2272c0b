//! `GET /v1/conversations/{id}/images/{hash}`: the stored bytes of an image
//! a conversation shows (a user's attachment or a tool result's image), so
//! the web console, or any client, can draw it.
//!
//! Only a conversation whose log names the hash serves it: blobs are shared
//! by content, and a client that knows one conversation must not read
//! another's images by guessing or learning a hash. The answer is read
//! from the store (`EventLog::uses_blob`, one key lookup on the real
//! engines, then the blob), so it wakes no evicted conversation and reads
//! none of its log. The media type is the bytes' own, by their signature:
//! every blob an image names was checked to be PNG, JPEG, GIF or WebP on
//! its way in, and re-encoded as such when it was scaled down
//! (`keel_actors::image`), so nothing else is ever answered, and `nosniff`
//! keeps a browser from taking it for more.

use axum::extract::{FromRequestParts, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use keel_actors::core::ConversationId;
use keel_actors::image::ImageFormat;
use keel_api::types::ErrorBody;
use keel_api::ErrorCode;

use super::error::ApiError;
use super::AppState;

/// A blob's bytes never change under its hash, so a browser may keep them
/// for good; `private`, because they are one user's.
const CACHE_FOREVER: &str = "private, max-age=31536000, immutable";

/// The stored bytes of an image the conversation's log names.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}/images/{hash}",
    tag = "conversations",
    params(
        ("id" = String, Path, description = "Conversation id"),
        ("hash" = String, Path, description = "The image's `hash` as the conversation shows it: the SHA-256 of its bytes, 64 lowercase hex digits"),
    ),
    responses(
        (status = 200, description = "The image's bytes, with its media type; cacheable for good (the hash names the bytes)",
            content(("image/png"), ("image/jpeg"), ("image/gif"), ("image/webp")),
            headers(
                ("Cache-Control" = String, description = "private, max-age=31536000, immutable"),
                ("X-Content-Type-Options" = String, description = "nosniff"),
            )),
        (status = 400, description = "The hash is not 64 lowercase hex digits", body = ErrorBody),
        (status = 404, description = "`not_found`: no such conversation; `unknown_image`: the conversation names no image with this hash, or its bytes are gone", body = ErrorBody),
    )
)]
pub async fn get_image(
    State(state): State<AppState>,
    ImagePath { conversation, hash }: ImagePath,
) -> Result<Response, ApiError> {
    let store = state.runtime.store();
    let id = conversation.as_str();
    let failed = |error: keel_actors::store::Error| ApiError::from_runtime(id, error.into());
    if !store
        .uses_blob(&conversation, &hash)
        .await
        .map_err(failed)?
    {
        // Only now is it worth asking whether the conversation exists.
        if store.last_seq(&conversation).await.map_err(failed)? == 0 {
            return Err(ApiError::not_found(id));
        }
        return Err(unknown_image(format!(
            "conversation {id} shows no image {hash}"
        )));
    }
    let Some(bytes) = store.get_blob(&hash).await.map_err(failed)? else {
        return Err(unknown_image(format!(
            "the bytes of image {hash} of conversation {id} are gone from the store"
        )));
    };
    let Some(format) = ImageFormat::detect(&bytes) else {
        tracing::error!(
            conversation = id,
            hash,
            "a stored image is not PNG, JPEG, GIF or WebP"
        );
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("the stored bytes of image {hash} are not PNG, JPEG, GIF or WebP"),
        ));
    };
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static(format.media_type())),
        (CONTENT_LENGTH, HeaderValue::from(bytes.len())),
        (CACHE_CONTROL, HeaderValue::from_static(CACHE_FOREVER)),
        (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
    ];
    Ok((headers, bytes).into_response())
}

fn unknown_image(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, ErrorCode::UnknownImage, message)
}

/// The conversation and the image's hash from the path. An id that cannot
/// be one names no conversation (404, as for `ConversationPath`); a hash
/// that is not a SHA-256 in lowercase hex, as every image shows it, is a
/// malformed request (400).
pub struct ImagePath {
    pub conversation: ConversationId,
    pub hash: String,
}

impl<S: Send + Sync> FromRequestParts<S> for ImagePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path((raw, hash)) =
            axum::extract::Path::<(String, String)>::from_request_parts(parts, state).await?;
        let conversation =
            ConversationId::new(raw.clone()).map_err(|_| ApiError::not_found(&raw))?;
        if !is_sha256_hex(&hash) {
            return Err(ApiError::bad_request(format!(
                "{hash:?} is not an image hash: 64 lowercase hex digits, as `hash` in the conversation's images"
            )));
        }
        Ok(ImagePath { conversation, hash })
    }
}

fn is_sha256_hex(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lowercase_hex_sha256_is_a_hash() {
        assert!(is_sha256_hex(&"0123456789abcdef".repeat(4)));
        assert!(!is_sha256_hex(&"0123456789ABCDEF".repeat(4)), "uppercase");
        assert!(!is_sha256_hex(&"a".repeat(63)), "short");
        assert!(!is_sha256_hex(&"a".repeat(65)), "long");
        assert!(!is_sha256_hex(&format!("{}g", "a".repeat(63))), "not hex");
        assert!(!is_sha256_hex(""));
    }
}
