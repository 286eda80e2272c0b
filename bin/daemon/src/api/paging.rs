//! Paging of the listings (`GET /v1/conversations`, `GET /admin/actors`):
//! `limit` (default [`DEFAULT_LIMIT`], at most [`MAX_LIMIT`]) and an opaque
//! `cursor`, the `next_cursor` of the page before. A listing is in a
//! stable order and a cursor names the last item of its page, so a page
//! goes on after it even when items were added or removed meanwhile.
//!
//! The cursor is the last item's sort key (text), URL-safe base64 encoded:
//! opaque to clients, who only hand it back.

use base64::Engine as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::error::ApiError;

/// Items per page when the request names no `limit`.
pub const DEFAULT_LIMIT: usize = 100;
/// The most items one page may hold.
pub const MAX_LIMIT: usize = keel_api::MAX_PAGE_LIMIT;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Items per page: 1 to 1000, default 100.
    pub limit: Option<usize>,
    /// Where to go on: the `next_cursor` of the page before.
    pub cursor: Option<String>,
}

impl PageQuery {
    /// The page size asked for, checked.
    pub fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
            Some(limit) => Err(ApiError::bad_request(format!(
                "limit is {limit}; it must be between 1 and {MAX_LIMIT}"
            ))),
        }
    }

    /// The sort key the page starts after, if a cursor was given.
    pub fn after(&self) -> Result<Option<String>, ApiError> {
        let Some(cursor) = &self.cursor else {
            return Ok(None);
        };
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cursor)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_request(
                    "cursor is not one this listing gave (use next_cursor as it came)",
                )
            })
    }
}

/// The cursor that goes on after the item whose sort key is `key`.
pub fn cursor(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

/// One page of `items`, given in their listing order with their sort keys
/// (ascending): those after `after`, at most `limit`, and the cursor of the
/// next page if any item is left.
pub fn page<T>(
    items: impl IntoIterator<Item = (String, T)>,
    after: Option<&str>,
    limit: usize,
) -> (Vec<T>, Option<String>) {
    let mut rest = items
        .into_iter()
        .filter(|(key, _)| after.is_none_or(|after| key.as_str() > after));
    let mut page = Vec::new();
    let mut last_key = None;
    for (key, item) in rest.by_ref().take(limit) {
        last_key = Some(key);
        page.push(item);
    }
    let next = match (rest.next(), last_key) {
        (Some(_), Some(key)) => Some(cursor(&key)),
        _ => None,
    };
    (page, next)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn keyed(keys: &[&str]) -> Vec<(String, String)> {
        keys.iter()
            .map(|key| ((*key).to_owned(), (*key).to_owned()))
            .collect()
    }

    #[test]
    fn pages_follow_each_other_through_their_cursors() {
        let items = keyed(&["a", "b", "c", "d", "e"]);
        let (first, next) = page(items.clone(), None, 2);
        assert_eq!(first, ["a", "b"]);
        let query = PageQuery {
            limit: Some(2),
            cursor: next,
        };
        let after = query.after().unwrap();
        let (second, next) = page(items.clone(), after.as_deref(), 2);
        assert_eq!(second, ["c", "d"]);
        let after = PageQuery {
            limit: None,
            cursor: next,
        }
        .after()
        .unwrap();
        let (third, next) = page(items, after.as_deref(), 2);
        assert_eq!(third, ["e"]);
        assert_eq!(next, None, "the last page has no cursor");
    }

    #[test]
    fn limits_and_cursors_are_checked() {
        assert_eq!(PageQuery::default().limit().unwrap(), DEFAULT_LIMIT);
        for limit in [0, MAX_LIMIT + 1] {
            let query = PageQuery {
                limit: Some(limit),
                cursor: None,
            };
            assert!(query.limit().is_err());
        }
        let query = PageQuery {
            limit: None,
            cursor: Some("!!".to_owned()),
        };
        assert!(query.after().is_err());
    }
}
