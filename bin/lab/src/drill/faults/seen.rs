//! What a case saw (the turn's events, the provider's recorded requests)
//! and the check of it against what was expected.

use super::matrix::{Case, Class, Expected, Mode, Wire};
use super::*;

/// What one turn looked like from outside.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Seen {
    /// States and what happened between them, in order: `streaming`,
    /// `retry 1 in 18 ms`, `fallback to openai/gpt-drill`, `idle`.
    pub(super) trail: Vec<String>,
    pub(super) end: Option<String>,
    /// The turn's error, when it failed.
    pub(super) error: Option<String>,
    pub(super) state: Option<ApiState>,
    pub(super) retry_delays_ms: Vec<u64>,
    pub(super) fallback_used: bool,
    pub(super) answered_by: Option<(String, String)>,
    /// Text deltas streamed live.
    pub(super) text_deltas: u32,
    /// Requests the fake provider got, by endpoint.
    pub(super) requests: HashMap<String, u32>,
}

#[derive(Debug, Serialize)]
pub struct CaseReport {
    pub(super) fault: &'static str,
    pub(super) class: Class,
    pub(super) wire: Wire,
    pub(super) fallback: Option<String>,
    pub(super) mode: Mode,
    pub(super) expected: Expected,
    pub(super) seen: Seen,
    /// What did not match; empty when the case passed.
    pub(super) violations: Vec<String>,
    pub(super) passed: bool,
}

impl CaseReport {
    pub(super) fn new(case: &Case, seen: Seen) -> CaseReport {
        let expected = case.expected();
        let violations = check(case, &expected, &seen);
        CaseReport {
            fault: case.fault.name,
            class: case.fault.class,
            wire: case.wire,
            fallback: case.fallback.then(|| case.wire.other().to_string()),
            mode: case.mode,
            passed: violations.is_empty(),
            expected,
            seen,
            violations,
        }
    }

    pub(super) fn broken(case: &Case, error: String) -> CaseReport {
        let mut report = CaseReport::new(case, Seen::default());
        report.violations = vec![format!("the case could not run: {error}")];
        report.passed = false;
        report
    }
}

/// Every way `seen` differs from `expected`.
pub(super) fn check(case: &Case, expected: &Expected, seen: &Seen) -> Vec<String> {
    let mut violations = Vec::new();
    let mut differs = |what: &str, want: String, got: String| {
        if want != got {
            violations.push(format!("{what}: expected {want}, got {got}"));
        }
    };
    differs(
        "end",
        expected.end.to_owned(),
        seen.end.clone().unwrap_or_else(|| "no end".to_owned()),
    );
    differs(
        "state after the turn",
        format!("{:?}", expected.state),
        seen.state
            .map_or_else(|| "none".to_owned(), |state| format!("{state:?}")),
    );
    differs(
        "retries",
        expected.retries.to_string(),
        seen.retry_delays_ms.len().to_string(),
    );
    differs(
        "fallback used",
        expected.fallback_used.to_string(),
        seen.fallback_used.to_string(),
    );
    differs(
        "answered by",
        format!("{:?}", expected.answered_by),
        format!("{:?}", seen.answered_by),
    );
    let requests = |wire: Wire| {
        wire.endpoint().map_or(0, |endpoint| {
            seen.requests.get(endpoint).copied().unwrap_or(0)
        })
    };
    if case.wire != Wire::Refused {
        differs(
            "requests to the primary",
            expected.primary_requests.to_string(),
            requests(case.wire).to_string(),
        );
    }
    differs(
        "requests to the fallback",
        expected.fallback_requests.to_string(),
        requests(case.wire.other()).to_string(),
    );
    if case.fault.retry_after {
        if let Some(delay) = seen
            .retry_delays_ms
            .iter()
            .find(|delay| **delay != RETRY_AFTER_CAP_MS)
        {
            violations.push(format!(
                "a retry waited {delay} ms, not the capped retry-after ({RETRY_AFTER_CAP_MS} ms)"
            ));
        }
    } else if let Some(delay) = seen
        .retry_delays_ms
        .iter()
        .find(|delay| **delay > MAX_DELAY_MS)
    {
        violations.push(format!(
            "a retry waited {delay} ms, past the backoff's ceiling ({MAX_DELAY_MS} ms)"
        ));
    }
    if expected.end == "failed" {
        let error = seen.error.as_deref().unwrap_or_default();
        if expected.retries > 0 && !error.contains(&format!("failed {} times", MAX_RETRIES + 1)) {
            violations.push(format!(
                "the turn's error does not say how often it was tried: {error:?}"
            ));
        }
    }
    if case.fault.class == Class::Healthy && seen.text_deltas < 2 {
        violations.push(format!(
            "a slow answer should stream word by word; {} text deltas",
            seen.text_deltas
        ));
    }
    violations
}

impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "ok  " } else { "FAIL" };
        let fallback = match &self.fallback {
            Some(to) => format!("fallback {to}"),
            None => "no fallback".to_owned(),
        };
        let mode = match self.mode {
            Mode::Always => "",
            Mode::Once => ", once",
        };
        writeln!(
            f,
            "{verdict} {} [{}, {fallback}{mode}]",
            self.fault, self.wire
        )?;
        writeln!(f, "     {}", self.seen.trail.join(" -> "))?;
        let end = self.seen.end.as_deref().unwrap_or("no end");
        match &self.seen.answered_by {
            Some((provider, model)) => {
                writeln!(f, "     end: {end}, answered by {provider}/{model}")?;
            }
            None => match &self.seen.error {
                Some(error) => writeln!(f, "     end: {end}: {error}")?,
                None => writeln!(f, "     end: {end}")?,
            },
        }
        for violation in &self.violations {
            writeln!(f, "     ! {violation}")?;
        }
        Ok(())
    }
}
