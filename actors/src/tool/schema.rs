//! The one place a call's input is checked against its tool's JSON schema:
//! [`Checked`] wraps every tool the registry holds, with the schema
//! compiled once when the tool is registered.
//!
//! Models do send input that does not fit (a missing field, a number as a
//! string). That is the model's mistake to fix, so it becomes an error
//! result naming each problem and where in the input it is, never a panic
//! or a failed turn.

use std::sync::Arc;

use keel_core::wire::ToolSpec;
use serde_json::Value;

use super::{Tool, ToolContext, ToolOutcome};

/// How many schema violations one error result lists; the rest are counted.
const MAX_LISTED: usize = 8;

/// A tool whose input is checked against its schema before it runs.
pub(crate) struct Checked {
    tool: Arc<dyn Tool>,
    /// `None` when the tool's own schema does not compile: a bug in the
    /// tool, logged at registration. Its calls then run unchecked rather
    /// than never, since the tool parses its input itself anyway.
    validator: Option<jsonschema::Validator>,
}

impl Checked {
    pub(crate) fn new(tool: Arc<dyn Tool>) -> Checked {
        let spec = tool.spec();
        let validator = match jsonschema::validator_for(&spec.input_schema) {
            Ok(validator) => Some(validator),
            Err(error) => {
                tracing::error!(
                    tool = %spec.name,
                    %error,
                    "the tool's input schema does not compile; its input goes unchecked"
                );
                None
            }
        };
        Checked { tool, validator }
    }

    /// Why `input` does not fit the schema, or `None` when it does.
    fn problems(&self, name: &str, input: &Value) -> Option<String> {
        let validator = self.validator.as_ref()?;
        let mut listed = Vec::new();
        let mut n_problems = 0usize;
        for error in validator.iter_errors(input) {
            n_problems += 1;
            if listed.len() < MAX_LISTED {
                let at = error.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                listed.push(format!("- at {at}: {error}"));
            }
        }
        if n_problems == 0 {
            return None;
        }
        let mut message = format!(
            "the input does not match the {name} tool's schema, so the tool did not run:\n{}",
            listed.join("\n")
        );
        if n_problems > listed.len() {
            message.push_str(&format!(
                "\n(and {} more problems)",
                n_problems - listed.len()
            ));
        }
        message.push_str(&format!("\ninput: {input}"));
        Some(message)
    }
}

#[async_trait::async_trait]
impl Tool for Checked {
    fn spec(&self) -> ToolSpec {
        self.tool.spec()
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        if let Some(problems) = self.problems(&ctx.call.name, &ctx.call.input) {
            return ToolOutcome::error(problems);
        }
        self.tool.run(ctx).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::tool::ReadFile;

    #[test]
    fn problems_name_the_place_and_the_rule() {
        let checked = Checked::new(Arc::new(ReadFile));
        assert!(checked
            .problems("read_file", &json!({"path": "a.txt", "offset": 3}))
            .is_none());
        let problems = checked
            .problems("read_file", &json!({"path": 7, "offset": 0}))
            .unwrap();
        assert!(
            problems.contains("at /path: 7 is not of type \"string\""),
            "{problems}"
        );
        assert!(
            problems.contains("at /offset: 0 is less than the minimum of 1"),
            "{problems}"
        );
        let problems = checked.problems("read_file", &json!({})).unwrap();
        assert!(
            problems.contains("at /: \"path\" is a required property"),
            "{problems}"
        );
    }

    /// A tool whose own schema is broken.
    struct Broken;

    #[async_trait::async_trait]
    impl Tool for Broken {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: "broken".to_owned(),
                description: String::new(),
                input_schema: json!({"type": 5}),
            }
        }

        async fn run(&self, _ctx: ToolContext) -> ToolOutcome {
            ToolOutcome::ok("ran")
        }
    }

    #[test]
    fn a_tool_whose_schema_does_not_compile_runs_unchecked() {
        let checked = Checked::new(Arc::new(Broken));
        assert!(checked.validator.is_none());
        assert!(checked.problems("broken", &json!("anything")).is_none());
    }
}
