//! The demo's one tool, `bash`, run for real: `bash -c CMD` as a child
//! process in the conversation's working directory, its stdout and stderr
//! captured. The actor runtime will stream output and kill process groups on
//! cancel; here the process simply runs to its end before the shell goes on.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use keel_actors::core::message::ToolCall;

use super::provider::BASH;

/// What running one tool call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRun {
    /// Output as the tool produced it: stdout, then stderr.
    pub chunks: Vec<String>,
    /// The result the model sees.
    pub content: String,
    pub is_error: bool,
    /// The exit code; `None` if the process never ran or a signal ended it.
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
}

/// Run `call` in `cwd`. A tool that cannot run is a result for the model
/// (REQ-BED-004), never an error of the demo.
pub fn run(call: &ToolCall, cwd: &Path) -> ToolRun {
    let started = Instant::now();
    let mut run = match command_of(call) {
        Ok(command) => run_bash(command, cwd),
        Err(refusal) => refused(refusal),
    };
    run.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    run
}

/// The command of a `bash` call, or why the call cannot run.
fn command_of(call: &ToolCall) -> Result<&str, String> {
    if call.name != BASH {
        return Err(format!(
            "unknown tool {:?}: this demo runs only {BASH:?}",
            call.name
        ));
    }
    match call
        .input
        .get("command")
        .and_then(|command| command.as_str())
    {
        Some(command) => Ok(command),
        None => Err(format!(
            "{BASH} needs input {{\"command\": \"...\"}}, got {}",
            call.input
        )),
    }
}

fn run_bash(command: &str, cwd: &Path) -> ToolRun {
    let output = Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(output) => {
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            let exit_code = output.status.code();
            let (content, is_error) = result_content(&stdout, &stderr, exit_code);
            ToolRun {
                chunks: [stdout, stderr]
                    .into_iter()
                    .filter(|chunk| !chunk.is_empty())
                    .collect(),
                content,
                is_error,
                exit_code,
                duration_ms: 0,
            }
        }
        Err(err) => refused(format!("could not start bash in {}: {err}", cwd.display())),
    }
}

fn refused(reason: String) -> ToolRun {
    ToolRun {
        chunks: Vec::new(),
        content: reason,
        is_error: true,
        exit_code: None,
        duration_ms: 0,
    }
}

/// The result the model sees: the output, and how the process ended unless
/// it succeeded. Any ending but exit code 0 is an error.
pub fn result_content(stdout: &str, stderr: &str, exit_code: Option<i32>) -> (String, bool) {
    let mut content = String::with_capacity(stdout.len() + stderr.len());
    for part in [stdout, stderr] {
        if part.is_empty() {
            continue;
        }
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(part);
    }
    let ending = match exit_code {
        Some(0) => None,
        Some(code) => Some(format!("[exit code {code}]")),
        None => Some("[killed by a signal]".to_owned()),
    };
    let is_error = ending.is_some();
    if let Some(ending) = ending {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(&ending);
    }
    (content, is_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_actors::core::ToolCallId;
    use serde_json::json;

    fn call(name: &str, input: serde_json::Value) -> ToolCall {
        ToolCall {
            id: ToolCallId::new("call-1-1"),
            name: name.to_owned(),
            input,
        }
    }

    #[test]
    fn success_is_the_plain_output() {
        assert_eq!(
            result_content("hi\n", "", Some(0)),
            ("hi\n".to_owned(), false)
        );
        assert_eq!(result_content("", "", Some(0)), (String::new(), false));
    }

    #[test]
    fn failure_keeps_both_streams_and_says_how_it_ended() {
        assert_eq!(
            result_content("out", "err\n", Some(2)),
            ("out\nerr\n[exit code 2]".to_owned(), true)
        );
        assert_eq!(
            result_content("", "", None),
            ("[killed by a signal]".to_owned(), true)
        );
    }

    #[test]
    fn calls_that_cannot_run_are_refused_with_a_reason() {
        let unknown = call("python", json!({ "command": "1" }));
        assert!(command_of(&unknown).is_err_and(|why| why.contains("only \"bash\"")));
        let no_command = call(BASH, json!({ "cmd": "ls" }));
        assert!(command_of(&no_command).is_err_and(|why| why.contains("needs input")));
        let good = call(BASH, json!({ "command": "ls" }));
        assert_eq!(command_of(&good), Ok("ls"));
    }

    #[test]
    fn bash_runs_in_the_given_directory() {
        let cwd = std::env::temp_dir();
        let run = run(
            &call(BASH, json!({ "command": "pwd; echo oops >&2; exit 3" })),
            &cwd,
        );
        assert!(run.is_error);
        assert_eq!(run.exit_code, Some(3));
        let canonical = cwd.canonicalize().unwrap();
        assert!(
            run.content.starts_with(canonical.to_str().unwrap()),
            "{:?}",
            run.content
        );
        assert!(run.content.ends_with("oops\n[exit code 3]"));
        assert_eq!(run.chunks.len(), 2);
    }
}
