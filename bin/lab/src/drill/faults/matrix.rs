//! The matrix of cases: every fault the fake provider can inject, on
//! each wire and each way of reading (streamed or not), and what keel
//! must do about each (retry, fall back, fail, time out).

use super::*;

/// What keel must do with a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Class {
    /// Retried, then handed to the fallback or failed.
    Retryable,
    /// Fails the turn at once: no retry, no fallback.
    Final,
    /// Not a failure: the answer completes.
    Healthy,
}

pub(super) struct Fault {
    pub(super) name: &'static str,
    pub(super) class: Class,
    /// The script entry that stages it (without `endpoint`); `None` for a
    /// refused connection, which no script stages.
    pub(super) entry: Option<fn() -> Value>,
    /// Retries wait exactly the capped `retry-after`.
    pub(super) retry_after: bool,
}

pub(super) const FAULTS: &[Fault] = &[
    Fault {
        name: "429 rate limited, retry-after 1 s",
        class: Class::Retryable,
        entry: Some(|| json!({"status": 429, "retry_after": 1})),
        retry_after: true,
    },
    Fault {
        name: "500 server error",
        class: Class::Retryable,
        entry: Some(|| json!({"status": 500})),
        retry_after: false,
    },
    Fault {
        name: "502 bad gateway",
        class: Class::Retryable,
        entry: Some(|| json!({"status": 502})),
        retry_after: false,
    },
    Fault {
        name: "503 unavailable",
        class: Class::Retryable,
        entry: Some(|| json!({"status": 503})),
        retry_after: false,
    },
    Fault {
        name: "529 overloaded",
        class: Class::Retryable,
        entry: Some(|| json!({"status": 529})),
        retry_after: false,
    },
    Fault {
        name: "400 bad request",
        class: Class::Final,
        entry: Some(|| json!({"status": 400})),
        retry_after: false,
    },
    Fault {
        name: "401 unauthorized",
        class: Class::Final,
        entry: Some(|| json!({"status": 401})),
        retry_after: false,
    },
    Fault {
        name: "403 forbidden",
        class: Class::Final,
        entry: Some(|| json!({"status": 403})),
        retry_after: false,
    },
    Fault {
        name: "404 not found",
        class: Class::Final,
        entry: Some(|| json!({"status": 404})),
        retry_after: false,
    },
    Fault {
        name: "cut mid-stream",
        class: Class::Retryable,
        entry: Some(
            || json!({"text": "a reply cut short by a dropped connection", "cut_after_events": 4}),
        ),
        retry_after: false,
    },
    Fault {
        name: "malformed SSE",
        class: Class::Retryable,
        entry: Some(|| json!({"malformed": true})),
        retry_after: false,
    },
    Fault {
        name: "error event mid-stream",
        class: Class::Retryable,
        entry: Some(
            || json!({"after_text": "half an answer", "error_event": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        retry_after: false,
    },
    Fault {
        name: "hang before the first byte",
        class: Class::Retryable,
        entry: Some(|| json!({"hang": true})),
        retry_after: false,
    },
    Fault {
        name: "stall mid-stream",
        class: Class::Retryable,
        entry: Some(|| json!({"text": "a reply that stops talking", "hang_after_events": 3})),
        retry_after: false,
    },
    Fault {
        name: "connection refused",
        class: Class::Retryable,
        entry: None,
        retry_after: false,
    },
    Fault {
        name: "slow drip",
        class: Class::Healthy,
        entry: Some(|| json!({"text": "a slow but steady answer", "drip_ms": 40})),
        retry_after: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Wire {
    Anthropic,
    Openai,
    /// A provider nobody listens for (the refused connection).
    Refused,
}

impl Wire {
    pub(super) fn provider(self) -> ApiProvider {
        match self {
            Wire::Anthropic => ApiProvider::Anthropic,
            Wire::Openai => ApiProvider::OpenAi,
            Wire::Refused => ApiProvider::Mock,
        }
    }

    pub(super) fn model(self) -> &'static str {
        match self {
            Wire::Anthropic => ANTHROPIC_MODEL,
            Wire::Openai => OPENAI_MODEL,
            Wire::Refused => "nobody",
        }
    }

    /// The fake provider's name for the endpoint this wire format uses.
    pub(super) fn endpoint(self) -> Option<&'static str> {
        match self {
            Wire::Anthropic => Some("anthropic"),
            Wire::Openai => Some("openai"),
            Wire::Refused => None,
        }
    }

    /// The fallback of a case on this wire: the other format.
    pub(super) fn other(self) -> Wire {
        match self {
            Wire::Anthropic | Wire::Refused => Wire::Openai,
            Wire::Openai => Wire::Anthropic,
        }
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Wire::Anthropic => "anthropic",
            Wire::Openai => "openai",
            Wire::Refused => "refused",
        })
    }
}

/// How often the fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    /// Every request to the primary.
    Always,
    /// The first request only; the retry gets a healthy answer.
    Once,
}

pub(super) struct Case {
    pub(super) fault: &'static Fault,
    pub(super) wire: Wire,
    pub(super) fallback: bool,
    pub(super) mode: Mode,
}

impl Case {
    /// Requests each wire format must get, and how the turn must end.
    pub(super) fn expected(&self) -> Expected {
        let attempts = MAX_RETRIES + 1;
        let primary = (self.wire, self.wire.model());
        let fallback = (self.wire.other(), self.wire.other().model());
        match (self.fault.class, self.mode, self.fallback) {
            (Class::Healthy, _, _) => Expected::completed(primary, 0, 1, 0, false),
            (Class::Final, _, _) => Expected::failed(0, 1),
            (Class::Retryable, Mode::Once, _) => Expected::completed(primary, 1, 2, 0, false),
            (Class::Retryable, Mode::Always, false) => Expected::failed(MAX_RETRIES, attempts),
            (Class::Retryable, Mode::Always, true) => {
                Expected::completed(fallback, MAX_RETRIES, attempts, 1, true)
            }
        }
    }
}

/// Every case, fault by fault.
pub(super) fn matrix() -> Vec<Case> {
    let mut cases = Vec::new();
    for fault in FAULTS {
        let wires: &[Wire] = if fault.entry.is_some() {
            &[Wire::Anthropic, Wire::Openai]
        } else {
            &[Wire::Refused]
        };
        for &wire in wires {
            for fallback in [false, true] {
                cases.push(Case {
                    fault,
                    wire,
                    fallback,
                    mode: Mode::Always,
                });
            }
            if fault.class == Class::Retryable && fault.entry.is_some() {
                cases.push(Case {
                    fault,
                    wire,
                    fallback: false,
                    mode: Mode::Once,
                });
            }
        }
    }
    cases
}

/// How a case must come out.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Expected {
    /// `completed` or `failed`.
    pub(super) end: &'static str,
    /// The state the conversation rests in after the turn.
    pub(super) state: ApiState,
    pub(super) retries: u32,
    /// Requests to the primary's wire format.
    pub(super) primary_requests: u32,
    /// Requests to the fallback's.
    pub(super) fallback_requests: u32,
    pub(super) fallback_used: bool,
    /// Who answered: provider and model.
    pub(super) answered_by: Option<(String, String)>,
}

impl Expected {
    pub(super) fn completed(
        by: (Wire, &str),
        retries: u32,
        primary_requests: u32,
        fallback_requests: u32,
        fallback_used: bool,
    ) -> Expected {
        Expected {
            end: "completed",
            state: ApiState::Idle,
            retries,
            primary_requests,
            fallback_requests,
            fallback_used,
            answered_by: Some((provider_name(by.0.provider()), by.1.to_owned())),
        }
    }

    pub(super) fn failed(retries: u32, primary_requests: u32) -> Expected {
        Expected {
            end: "failed",
            state: ApiState::Error,
            retries,
            primary_requests,
            fallback_requests: 0,
            fallback_used: false,
            answered_by: None,
        }
    }
}

pub(super) fn provider_name(provider: ApiProvider) -> String {
    serde_json::to_value(provider)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{provider:?}"))
}
