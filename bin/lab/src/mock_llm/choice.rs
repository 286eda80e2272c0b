//! Which answer a request gets, in the order of precedence the parent
//! module's doc gives: the `x-mock-fault` header, a refusal as too long
//! (`settings`), the script (`script`), the fake's summary for a summary
//! request (`summary`), the default behaviour (`reply`). Apart from
//! rendering and sending the answer, so the rules that decide it, and what
//! each takes from the script, are read and tested in one place.

use axum::http::HeaderMap;
use serde_json::Value;

use super::recording::Source;
use super::script::{self, Action, Content, Entry, Reply, StatusFault, WireApi};
use super::{anthropic, openai, summary, Mock, FAULT_HEADER};

/// What answers a request, and where that came from.
#[derive(Debug)]
pub(super) struct Choice {
    pub(super) source: Source,
    /// The script entry or header JSON that answers, as given.
    pub(super) entry: Option<Value>,
    pub(super) action: Action,
}

impl Choice {
    /// `entry` answers. A summary request it leaves to the default content
    /// (a stall, a drip) gets the fake's summary, not an echo of the
    /// transcript.
    fn entry(source: Source, entry: Entry, summary: bool, request: &Value) -> Choice {
        let mut action = entry.action;
        if let (true, Action::Reply(reply)) = (summary, &mut action) {
            if reply.content == Content::Default {
                reply.content = summary_content(request);
            }
        }
        Choice {
            source,
            entry: Some(entry.source),
            action,
        }
    }
}

/// The fake's own answer to a summary request: its summary, as text.
fn summary_content(request: &Value) -> Content {
    Content::Given {
        text: Some(summary::summary(request)),
        tool_calls: Vec::new(),
    }
}

impl Mock {
    /// What answers this request, in the order of precedence the module
    /// doc gives. A bad `x-mock-fault` header is an error.
    pub(super) fn choose(
        &self,
        endpoint: WireApi,
        headers: &HeaderMap,
        request: &Value,
        prompt_tokens: u64,
    ) -> Result<Choice, String> {
        let summary = summary::is_summary_request(endpoint, request);
        if let Some(fault) = headers.get(FAULT_HEADER) {
            let entry = fault
                .to_str()
                .map_err(|err| err.to_string())
                .and_then(|text| serde_json::from_str::<Value>(text).map_err(|err| err.to_string()))
                .and_then(|value| Entry::parse(&value).map_err(|err| err.to_string()))
                .map_err(|err| format!("mock-llm: bad {FAULT_HEADER} header: {err}"))?;
            return Ok(Choice::entry(Source::Header, entry, summary, request));
        }
        // Refused before the script is looked at: the entry planned for
        // this turn waits for the request keel sends once it has compacted.
        let refused = self.settings().refuses(prompt_tokens);
        if let Some(window) = refused {
            let body = match endpoint {
                WireApi::Anthropic => anthropic::too_long_body(prompt_tokens, window),
                WireApi::Openai => openai::too_long_body(prompt_tokens, window),
            };
            let fault = StatusFault {
                status: 400,
                retry_after: None,
                retry_after_ms: None,
                body: Some(body),
            };
            return Ok(Choice {
                source: Source::TooLong,
                entry: None,
                action: Action::Status(fault),
            });
        }
        let prompt = script::prompt_text(request);
        let taken = self.script().take_for(endpoint, &prompt, summary);
        Ok(match taken {
            Some(entry) => Choice::entry(Source::Script, entry, summary, request),
            None if summary => Choice {
                source: Source::Summary,
                entry: None,
                action: Action::Reply(Reply::plain(summary_content(request))),
            },
            None => Choice {
                source: Source::Default,
                entry: None,
                action: Action::Reply(Reply::plain(Content::Default)),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;
    use crate::mock_llm::script::parse_script;
    use crate::mock_llm::{tokens, Settings};

    fn turn(text: &str) -> Value {
        json!({"messages": [{"role": "user", "content": text}]})
    }

    fn summary_request() -> Value {
        json!({
            "system": "[keel:summary] Summarise.",
            "messages": [{"role": "user", "content": "The transcript:\n\nUser: count the files\n\nAssistant: Three."}]
        })
    }

    /// What `mock` chooses for `request` on Anthropic's wire, without a
    /// header: where the answer comes from and the entry that gives it.
    fn choose(mock: &Mock, request: &Value) -> (Source, Option<Value>, Action) {
        let prompt_tokens = tokens::prompt_tokens(request);
        let choice = mock
            .choose(
                WireApi::Anthropic,
                &HeaderMap::new(),
                request,
                prompt_tokens,
            )
            .unwrap();
        (choice.source, choice.entry, choice.action)
    }

    #[test]
    fn a_prompt_over_the_window_is_refused_and_leaves_the_script_alone() {
        let mock = Mock::default();
        mock.script()
            .push(parse_script(&json!([{"text": "planned"}])).unwrap());
        *mock.settings() = Settings::with_context_window(Some(10)).unwrap();
        let long = turn(&"word ".repeat(20));
        let (source, entry, action) = choose(&mock, &long);
        assert_eq!((source, entry), (Source::TooLong, None));
        let Action::Status(fault) = action else {
            panic!("a refusal: {action:?}")
        };
        assert_eq!(fault.status, 400);
        assert_eq!(
            fault.body,
            Some(anthropic::too_long_body(tokens::prompt_tokens(&long), 10))
        );
        assert_eq!(mock.script().len(), 1, "the planned reply still waits");
        // A summary request over the window is refused the same way.
        *mock.settings() = Settings::with_context_window(Some(5)).unwrap();
        assert_eq!(choose(&mock, &summary_request()).0, Source::TooLong);
        // A prompt that fits takes the planned reply.
        *mock.settings() = Settings::with_context_window(Some(1_000)).unwrap();
        assert_eq!(choose(&mock, &long).0, Source::Script);
        // The header still decides over everything.
        *mock.settings() = Settings::with_context_window(Some(1)).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            FAULT_HEADER,
            HeaderValue::from_static(r#"{"text": "forced"}"#),
        );
        let choice = mock
            .choose(WireApi::Openai, &headers, &long, 1_000)
            .unwrap();
        assert_eq!(choice.source, Source::Header);
    }

    #[test]
    fn summary_requests_get_a_summary_without_taking_the_turns_replies() {
        let mock = Mock::default();
        mock.script()
            .push(parse_script(&json!([{"text": "for the next turn"}])).unwrap());
        let (source, entry, action) = choose(&mock, &summary_request());
        assert_eq!((source, entry), (Source::Summary, None));
        let Action::Reply(reply) = action else {
            panic!("a reply: {action:?}")
        };
        let Content::Given {
            text: Some(text), ..
        } = reply.content
        else {
            panic!("a text: {:?}", reply.content)
        };
        assert_eq!(
            text,
            "Summary of the earlier conversation (2 transcript lines, 1 from the user). \
             The user mentioned: count the files."
        );
        assert_eq!(mock.script().len(), 1);
        assert_eq!(choose(&mock, &turn("hi")).0, Source::Script);

        // A summary entry serves the summary; one that leaves the content
        // to the default gets the fake's summary, dripped.
        mock.script().push(
            parse_script(&json!([
                {"summary": true, "status": 500},
                {"summary": true, "drip_ms": 5},
            ]))
            .unwrap(),
        );
        let (source, entry, _) = choose(&mock, &summary_request());
        assert_eq!(source, Source::Script);
        assert_eq!(entry, Some(json!({"summary": true, "status": 500})));
        let (_, _, action) = choose(&mock, &summary_request());
        let Action::Reply(reply) = action else {
            panic!("a reply: {action:?}")
        };
        assert_eq!(reply.drip_ms, Some(5));
        assert!(
            matches!(&reply.content, Content::Given { text: Some(text), .. } if text.starts_with("Summary of")),
            "{:?}",
            reply.content
        );
        assert_eq!(choose(&mock, &turn("hi")).0, Source::Default);
    }
}
