//! Token usage: keel's [`Usage`] from the `usage` member of the chunk that
//! `stream_options.include_usage` adds at the end.
//!
//! Apart because it is arithmetic with a trap of its own: OpenAI counts
//! cached tokens inside `prompt_tokens` where keel counts them apart, and
//! DeepSeek and OpenRouter report their cache fields under other names.

use serde_json::Value;

use crate::message::Usage;

/// keel's usage from OpenAI's. `prompt_tokens` counts every input token,
/// cached or not, while keel counts uncached input, cache reads and cache
/// writes apart (their sum is the prompt): cached tokens are moved out of
/// `input_tokens` so nothing is counted twice.
pub(super) fn parse_usage(usage: &Value) -> Usage {
    let count = |value: Option<&Value>| value.and_then(Value::as_u64);
    let details = usage.get("prompt_tokens_details");
    let prompt = count(usage.get("prompt_tokens")).unwrap_or(0);
    let cache_read = count(details.and_then(|details| details.get("cached_tokens")))
        // DeepSeek reports its cache hits at the top level.
        .or_else(|| count(usage.get("prompt_cache_hit_tokens")))
        .unwrap_or(0)
        .min(prompt);
    // OpenRouter reports cache writes (of providers that bill them).
    let cache_write = count(details.and_then(|details| details.get("cache_write_tokens")))
        .unwrap_or(0)
        .min(prompt - cache_read);
    Usage {
        input_tokens: prompt - cache_read - cache_write,
        output_tokens: count(usage.get("completion_tokens")).unwrap_or(0),
        cache_creation_input_tokens: cache_write,
        cache_read_input_tokens: cache_read,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn usage_moves_cached_tokens_out_of_input() {
        let usage = parse_usage(&json!({
            "prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
            "prompt_tokens_details": { "cached_tokens": 800 },
        }));
        assert_eq!(
            usage,
            Usage {
                input_tokens: 200,
                output_tokens: 50,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 800,
            }
        );
        assert_eq!(usage.context_tokens(), 1050);
    }

    #[test]
    fn usage_reads_deepseek_and_openrouter_cache_fields_and_never_underflows() {
        let deepseek = parse_usage(&json!({
            "prompt_tokens": 100, "completion_tokens": 5,
            "prompt_cache_hit_tokens": 60, "prompt_cache_miss_tokens": 40,
        }));
        assert_eq!(
            (deepseek.input_tokens, deepseek.cache_read_input_tokens),
            (40, 60)
        );
        let openrouter = parse_usage(&json!({
            "prompt_tokens": 100, "completion_tokens": 5,
            "prompt_tokens_details": { "cached_tokens": 30, "cache_write_tokens": 10 },
        }));
        assert_eq!(
            (
                openrouter.input_tokens,
                openrouter.cache_read_input_tokens,
                openrouter.cache_creation_input_tokens
            ),
            (60, 30, 10)
        );
        let nonsense = parse_usage(&json!({
            "prompt_tokens": 5, "prompt_tokens_details": { "cached_tokens": 9, "cache_write_tokens": 9 },
        }));
        assert_eq!(nonsense.context_tokens(), 5);
        assert_eq!(parse_usage(&json!({})), Usage::default());
    }
}
