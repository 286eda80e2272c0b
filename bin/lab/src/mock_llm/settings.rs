//! The fake provider's settings: what it is like as a model, apart from
//! what it is scripted to say. For now the context window: a prompt
//! estimated (see `tokens`) above it is refused with the provider's real
//! "too long" error, which is how keel's compaction on refusal is tested
//! with no key.
//!
//! They come from `keel mock-llm --context-window TOKENS`, from the
//! in-process starters' arguments, from `KEEL_MOCK_CONTEXT_WINDOW` for the
//! fake `keel serve` starts when no provider is configured, and at any time
//! from `POST /_mock/settings` (a change applies to the requests that
//! arrive after it).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variable the built-in fake provider of `keel serve`
/// reads its context window from.
pub const CONTEXT_WINDOW_ENV: &str = "KEEL_MOCK_CONTEXT_WINDOW";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// The most prompt tokens a request may have; `None`: no limit.
    pub context_window: Option<u64>,
}

/// A change to the settings, as `POST /_mock/settings` takes it: each
/// field given is set (`null` takes a limit away), the others are kept.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    #[serde(default, deserialize_with = "present")]
    context_window: Option<Option<u64>>,
}

/// A field that is there, even as `null`, is `Some`.
fn present<'de, D>(deserializer: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<u64>::deserialize(deserializer).map(Some)
}

impl Settings {
    /// Settings with this context window, or why it cannot be one.
    pub fn with_context_window(context_window: Option<u64>) -> Result<Settings, String> {
        Ok(Settings {
            context_window: checked_window(context_window)?,
        })
    }

    /// These settings with `change` (a JSON object) made, or why it was
    /// refused; nothing is changed then.
    pub fn changed(self, change: &Value) -> Result<Settings, String> {
        const SHAPE: &str = "settings are {\"context_window\": TOKENS or null}";
        if !change.is_object() {
            return Err(format!("{SHAPE}, not {change}"));
        }
        let change = Change::deserialize(change).map_err(|err| format!("{SHAPE}: {err}"))?;
        let mut settings = self;
        if let Some(context_window) = change.context_window {
            settings.context_window = checked_window(context_window)?;
        }
        Ok(settings)
    }

    /// The settings of `keel serve`'s built-in fake provider, from the
    /// environment `lookup` reads.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let context_window = match lookup(CONTEXT_WINDOW_ENV) {
            None => None,
            Some(text) => {
                let tokens = text.trim().parse::<u64>().map_err(|_| {
                    format!("{CONTEXT_WINDOW_ENV} is a number of tokens, not {text:?}")
                })?;
                Some(tokens)
            }
        };
        Settings::with_context_window(context_window)
            .map_err(|err| format!("{CONTEXT_WINDOW_ENV}: {err}"))
    }

    /// Whether a prompt of `prompt_tokens` is over the window; the window
    /// when it is.
    pub fn refuses(&self, prompt_tokens: u64) -> Option<u64> {
        self.context_window.filter(|&window| prompt_tokens > window)
    }
}

/// A window of no tokens would refuse everything: a mistake, not a setting.
fn checked_window(window: Option<u64>) -> Result<Option<u64>, String> {
    match window {
        Some(0) => Err("a context window of 0 tokens would refuse every request".to_owned()),
        window => Ok(window),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_change_sets_what_it_names_and_null_takes_the_window_away() {
        let none = Settings::default();
        let small = none.changed(&json!({"context_window": 500})).unwrap();
        assert_eq!(small.context_window, Some(500));
        assert_eq!(small.changed(&json!({})).unwrap(), small, "nothing named");
        assert_eq!(
            small.changed(&json!({"context_window": null})).unwrap(),
            none
        );
        assert_eq!(small.refuses(500), None);
        assert_eq!(small.refuses(501), Some(500));
        assert_eq!(none.refuses(u64::MAX), None);
    }

    #[test]
    fn a_bad_change_is_refused_with_a_reason() {
        let none = Settings::default();
        for (change, words) in [
            (json!({"context_windw": 5}), "unknown field"),
            (json!({"context_window": -1}), "context_window"),
            (json!({"context_window": "big"}), "context_window"),
            (json!({"context_window": 0}), "refuse every request"),
            (json!([1]), "context_window"),
        ] {
            let err = none.changed(&change).unwrap_err();
            assert!(err.contains(words), "{change}: {err}");
        }
    }

    #[test]
    fn the_built_in_provider_reads_its_window_from_the_environment() {
        let env = |value: Option<&'static str>| {
            move |name: &str| {
                assert_eq!(name, CONTEXT_WINDOW_ENV);
                value.map(str::to_owned)
            }
        };
        assert_eq!(Settings::from_env(env(None)), Ok(Settings::default()));
        assert_eq!(
            Settings::from_env(env(Some("8000"))).map(|settings| settings.context_window),
            Ok(Some(8_000))
        );
        let err = Settings::from_env(env(Some("8k"))).unwrap_err();
        assert!(
            err.contains(CONTEXT_WINDOW_ENV) && err.contains("\"8k\""),
            "{err}"
        );
        assert!(Settings::from_env(env(Some("0"))).is_err());
    }
}
