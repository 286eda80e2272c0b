//! The tools keel-core handles itself, in one place: their names, the input
//! fields core reads, the specs the model is shown, and who is offered
//! which. The shell sends these specs with every request (beside the tools
//! it runs) and never runs these calls; the transition turns them into a
//! question for the user (`ask_user`), a sub-agent's result
//! (`submit_result`) or sub-agents (`spawn_agents`).

use serde_json::{json, Value};

use crate::config::DEFAULT_MAX_CHILDREN;
use crate::message::ToolCall;
use crate::wire::ToolSpec;

/// A question for the user: the turn waits for the answer.
pub const ASK_USER: &str = "ask_user";
/// The input field `ask_user` reads its question from.
pub const ASK_USER_QUESTION: &str = "question";

/// A sub-agent's final answer to its parent; the sub-agent ends.
pub const SUBMIT_RESULT: &str = "submit_result";
/// The input field `submit_result` reads the result from.
pub const SUBMIT_RESULT_RESULT: &str = "result";

/// Starts sub-agents; the shell carries it out as `Effect::SpawnSubAgents`.
pub const SPAWN_AGENTS: &str = "spawn_agents";
/// The input field `spawn_agents` reads its list of tasks from.
pub const SPAWN_AGENTS_TASKS: &str = "tasks";

/// Added to a sub-agent's prompt when it answers in text without submitting.
pub(crate) const NUDGE_SUBMIT: &str = "You are a sub-agent: your work ends only when you call submit_result with your result. Call it now if you are done.";
/// Added to a sub-agent's prompt when it reaches its turn cap.
pub(crate) const NUDGE_TURN_CAP: &str = "You have reached your turn limit. This is your last turn: call submit_result now with the best result you have.";

/// Whether `name` is a tool keel-core handles itself: a tool of the shell's
/// registry by that name would never run.
pub fn is_builtin(name: &str) -> bool {
    matches!(name, ASK_USER | SUBMIT_RESULT | SPAWN_AGENTS)
}

/// Whether a call to `name` must be the only call in its response: asking
/// the human and ending the sub-agent do not mix with other work.
pub fn is_exclusive(name: &str) -> bool {
    matches!(name, ASK_USER | SUBMIT_RESULT)
}

/// The specs of the built-in tools a conversation is offered: a user's
/// conversation may ask its user; a sub-agent has no human to ask
/// (REQ-BED-009: only the result submission tool plus standard tools) and
/// must submit its result.
pub fn offered(sub_agent: bool) -> Vec<ToolSpec> {
    if sub_agent {
        vec![submit_result_spec()]
    } else {
        vec![ask_user_spec(), spawn_agents_spec()]
    }
}

/// One task of a `spawn_agents` call: what the sub-agent is asked to do,
/// and where it works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnTask {
    /// The sub-agent's first (and only) user message.
    pub task: String,
    /// Its working directory; relative to the parent's, which is the
    /// default.
    pub cwd: Option<String>,
}

/// The tasks of a `spawn_agents` call, or why the call is refused: no
/// task list, an empty one, a task without text, more tasks than
/// `max_children`, or (unless `may_leave_cwd`) a task directory that is
/// absolute or climbs out with `..`: a confined conversation's sub-agents
/// stay inside its directory too (the shell checks symbolic links when it
/// creates them). The reason is written for the model to correct its call.
/// A bare string is taken as a task without a directory.
pub fn spawn_tasks(
    call: &ToolCall,
    max_children: u32,
    may_leave_cwd: bool,
) -> Result<Vec<SpawnTask>, String> {
    let Some(Value::Array(items)) = call.input.get(SPAWN_AGENTS_TASKS) else {
        return Err(format!(
            "spawn_agents needs {SPAWN_AGENTS_TASKS:?}: a list of {{\"task\": string, \"cwd\"?: string}}"
        ));
    };
    if items.is_empty() {
        return Err("spawn_agents needs at least one task".to_owned());
    }
    if items.len() > max_children as usize {
        return Err(format!(
            "spawn_agents starts at most {max_children} sub-agents per call; {} tasks were given. Split them into several calls, or combine tasks",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(task_idx, item)| {
            let number = task_idx + 1;
            let (task, cwd) = match item {
                Value::String(task) => (Some(task.as_str()), None),
                Value::Object(fields) => (
                    fields.get("task").and_then(Value::as_str),
                    fields.get("cwd"),
                ),
                _ => (None, None),
            };
            let task = task
                .map(str::trim)
                .filter(|task| !task.is_empty())
                .ok_or_else(|| format!("spawn_agents: task {number} has no \"task\" text"))?;
            let cwd = match cwd {
                None | Some(Value::Null) => None,
                Some(Value::String(cwd)) if !cwd.is_empty() => {
                    let path = std::path::Path::new(cwd);
                    let climbs = path.is_absolute()
                        || path
                            .components()
                            .any(|part| matches!(part, std::path::Component::ParentDir));
                    if climbs && !may_leave_cwd {
                        return Err(format!(
                            "spawn_agents: the \"cwd\" of task {number} must be a directory inside yours, given relative to it without \"..\": this conversation's tools may not leave its directory"
                        ));
                    }
                    Some(cwd.clone())
                }
                Some(_) => {
                    return Err(format!(
                        "spawn_agents: the \"cwd\" of task {number} is not a directory path"
                    ))
                }
            };
            Ok(SpawnTask {
                task: task.to_owned(),
                cwd,
            })
        })
        .collect()
}

/// The question of an `ask_user` call, as the user will read it.
pub fn question(call: &ToolCall) -> String {
    match call.input.get(ASK_USER_QUESTION) {
        Some(Value::String(text)) => text.clone(),
        _ => call.input.to_string(),
    }
}

/// The result of a `submit_result` call.
pub fn submitted_result(call: &ToolCall) -> String {
    match call.input.get(SUBMIT_RESULT_RESULT) {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => call.input.to_string(),
    }
}

/// `ask_user`: the turn waits until the user answers (or declines), and the
/// call is refused alongside other calls, so the description says so.
fn ask_user_spec() -> ToolSpec {
    ToolSpec {
        name: ASK_USER.to_owned(),
        description: "Ask the user a question and wait for the answer. Use it when you \
                      cannot go on without the user's input. It must be the only tool call \
                      in its response. The user may decline to answer."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                ASK_USER_QUESTION: {
                    "type": "string",
                    "description": "The question, as the user will read it."
                }
            },
            "required": [ASK_USER_QUESTION]
        }),
    }
}

/// `spawn_agents`: tasks run in parallel by sub-agents; the call's result
/// gathers theirs, in task order.
fn spawn_agents_spec() -> ToolSpec {
    ToolSpec {
        name: SPAWN_AGENTS.to_owned(),
        description: format!(
            "Start sub-agents that work on independent tasks in parallel, and wait for them. \
             Each gets one task as its only instruction, its own history, and the standard \
             tools; it cannot ask the user or start sub-agents of its own, and it ends by \
             submitting a result. The result of this call lists every task's outcome in \
             order: the submitted result, or why there is none (failed, timed out, turn \
             limit reached). At most {DEFAULT_MAX_CHILDREN} tasks per call. Write each task \
             so that it can be done without seeing this conversation."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                SPAWN_AGENTS_TASKS: {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": DEFAULT_MAX_CHILDREN,
                    "items": {
                        "type": "object",
                        "properties": {
                            "task": {
                                "type": "string",
                                "description": "What the sub-agent must do, complete: it sees nothing else."
                            },
                            "cwd": {
                                "type": "string",
                                "description": "Its working directory, relative to yours; yours if left out."
                            }
                        },
                        "required": ["task"]
                    }
                }
            },
            "required": [SPAWN_AGENTS_TASKS]
        }),
    }
}

/// `submit_result`: a sub-agent's answer to its parent; the sub-agent ends.
fn submit_result_spec() -> ToolSpec {
    ToolSpec {
        name: SUBMIT_RESULT.to_owned(),
        description: "Finish your task and hand its result to the agent that started you. \
                      Call it once, when the task is done; it must be the only tool call in \
                      its response, and you stop after it."
            .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                SUBMIT_RESULT_RESULT: {
                    "type": "string",
                    "description": "The result of your task, complete: the parent sees only this."
                }
            },
            "required": [SUBMIT_RESULT_RESULT]
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_agent_is_offered_submit_result_and_never_ask_user() {
        let names =
            |specs: Vec<ToolSpec>| specs.into_iter().map(|spec| spec.name).collect::<Vec<_>>();
        assert_eq!(names(offered(true)), [SUBMIT_RESULT]);
        assert_eq!(names(offered(false)), [ASK_USER, SPAWN_AGENTS]);
    }

    fn spawn(input: Value) -> Result<Vec<SpawnTask>, String> {
        let call = ToolCall {
            id: crate::ids::ToolCallId::new("t1"),
            name: SPAWN_AGENTS.to_owned(),
            input,
        };
        spawn_tasks(&call, 2, false)
    }

    #[test]
    fn spawn_tasks_are_read_in_order_and_refused_with_a_reason() {
        let tasks = spawn(json!({"tasks": [{"task": "a", "cwd": "sub"}, "b"]})).unwrap();
        assert_eq!(
            tasks,
            [
                SpawnTask {
                    task: "a".to_owned(),
                    cwd: Some("sub".to_owned())
                },
                SpawnTask {
                    task: "b".to_owned(),
                    cwd: None
                }
            ]
        );
        assert!(spawn(json!({})).unwrap_err().contains("needs \"tasks\""));
        assert!(spawn(json!({"tasks": []}))
            .unwrap_err()
            .contains("at least one"));
        let over = spawn(json!({"tasks": ["a", "b", "c"]})).unwrap_err();
        assert!(over.contains("at most 2"), "{over}");
        assert!(spawn(json!({"tasks": [{"task": " "}]}))
            .unwrap_err()
            .contains("task 1 has no"));
        assert!(spawn(json!({"tasks": [{"task": "a", "cwd": 3}]}))
            .unwrap_err()
            .contains("cwd"));
        // An empty path names no directory: refused, not taken as "here".
        let empty = spawn(json!({"tasks": [{"task": "a", "cwd": ""}]})).unwrap_err();
        assert!(empty.contains("is not a directory path"), "{empty}");
        for outside in ["/etc", "../sibling", "sub/../../up"] {
            let refused = spawn(json!({"tasks": [{"task": "a", "cwd": outside}]})).unwrap_err();
            assert!(refused.contains("inside yours"), "{outside}: {refused}");
        }
        let call = ToolCall {
            id: crate::ids::ToolCallId::new("t1"),
            name: SPAWN_AGENTS.to_owned(),
            input: json!({"tasks": [{"task": "a", "cwd": "/etc"}]}),
        };
        assert!(spawn_tasks(&call, 2, true).is_ok(), "allowed to leave");
    }

    #[test]
    fn the_built_ins_are_known_by_name_and_nothing_else_is() {
        for name in [ASK_USER, SUBMIT_RESULT, SPAWN_AGENTS] {
            assert!(is_builtin(name), "{name}");
        }
        for name in ["bash", "read_file", "", "ask_user ", "Spawn_agents"] {
            assert!(!is_builtin(name), "{name:?}");
        }
    }

    #[test]
    fn every_spec_requires_the_field_core_reads() {
        for spec in offered(false).into_iter().chain(offered(true)) {
            let field = match spec.name.as_str() {
                ASK_USER => ASK_USER_QUESTION,
                SUBMIT_RESULT => SUBMIT_RESULT_RESULT,
                SPAWN_AGENTS => SPAWN_AGENTS_TASKS,
                other => panic!("unexpected built-in {other}"),
            };
            assert_eq!(
                spec.input_schema["required"],
                json!([field]),
                "{}",
                spec.name
            );
            assert!(spec.input_schema["properties"].get(field).is_some());
        }
    }
}
