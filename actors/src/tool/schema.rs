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
    validator: Option<Validator>,
}

/// A tool's input schema, compiled (by boon: every draft from 4 to
/// 2020-12, and a fraction of jsonschema's build time, which was the
/// heaviest crate of a fresh release build).
struct Validator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

/// The name a tool's schema is compiled under. Nothing is ever fetched
/// from it: references resolve inside the schema or not at all.
const SCHEMA_URL: &str = "https://keel.invalid/tool-input.json";

impl Validator {
    /// The schema compiled, or why it does not compile (with its cause).
    fn compile(schema: &Value) -> Result<Validator, String> {
        let why = |error: boon::CompileError| format!("{error:#}");
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        // A schema comes from a tool, a client or (later) an MCP server: it
        // may not make keel read files (boon's default loads `file:` URLs)
        // or fetch anything. The drafts' own metaschemas are built in.
        compiler.use_loader(Box::new(boon::SchemeUrlLoader::new()));
        compiler
            .add_resource(SCHEMA_URL, schema.clone())
            .map_err(why)?;
        let index = compiler.compile(SCHEMA_URL, &mut schemas).map_err(why)?;
        Ok(Validator { schemas, index })
    }

    /// Every leaf violation of `input`, as (where in the input, what).
    fn violations(&self, input: &Value) -> Vec<(String, String)> {
        let mut found = Vec::new();
        if let Err(error) = self.schemas.validate(input, self.index) {
            leaves(&error, &mut found);
        }
        found
    }
}

/// The leaves of boon's tree of errors: the groups above them ("validation
/// failed") say nothing a model can act on.
fn leaves(error: &boon::ValidationError<'_, '_>, found: &mut Vec<(String, String)>) {
    if error.causes.is_empty() {
        let at = error.instance_location.to_string();
        let at = if at.is_empty() { "/".to_owned() } else { at };
        found.push((at, error.kind.to_string()));
    }
    for cause in &error.causes {
        leaves(cause, found);
    }
}

/// Why `schema` does not compile as a JSON schema, if it does not: a
/// schema a provider would refuse along with the tool.
pub(crate) fn compile_error(schema: &Value) -> Option<String> {
    Validator::compile(schema).err()
}

impl Checked {
    pub(crate) fn new(tool: Arc<dyn Tool>) -> Checked {
        let spec = tool.spec();
        let validator = match Validator::compile(&spec.input_schema) {
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
        let violations = self.validator.as_ref()?.violations(input);
        if violations.is_empty() {
            return None;
        }
        let listed: Vec<String> = violations
            .iter()
            .take(MAX_LISTED)
            .map(|(at, what)| format!("- at {at}: {what}"))
            .collect();
        let mut message = format!(
            "the input does not match the {name} tool's schema, so the tool did not run:\n{}",
            listed.join("\n")
        );
        if violations.len() > listed.len() {
            message.push_str(&format!(
                "\n(and {} more problems)",
                violations.len() - listed.len()
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
            problems.contains("at /path: want string, but got number"),
            "{problems}"
        );
        assert!(
            problems.contains("at /offset: must be >=1, but got 0"),
            "{problems}"
        );
        let problems = checked.problems("read_file", &json!({})).unwrap();
        assert!(
            problems.contains("at /: missing properties 'path'"),
            "{problems}"
        );
    }

    /// A schema may not make keel read a file or fetch anything: a
    /// reference outside the schema does not compile, while one inside it
    /// and the drafts' own metaschemas do.
    #[test]
    fn references_outside_the_schema_are_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.json");
        std::fs::write(&outside, r#"{"type": "string"}"#).unwrap();
        let by_file = json!({"$ref": format!("file://{}", outside.display())});
        assert!(Validator::compile(&by_file).is_err());
        assert!(Validator::compile(&json!({"$ref": "http://127.0.0.1:9/s.json"})).is_err());

        let inside = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": {"name": {"type": "string"}},
            "type": "object",
            "properties": {"name": {"$ref": "#/$defs/name"}}
        });
        let validator = Validator::compile(&inside).unwrap();
        assert!(validator.violations(&json!({"name": "a"})).is_empty());
        assert_eq!(
            validator.violations(&json!({"name": 1})),
            vec![("/name".to_owned(), "want string, but got number".to_owned())]
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
