//! Compaction through the state machine (docs/compaction.md): a long
//! conversation in a small context window goes on turn after turn, a
//! provider's "too long" ends in a compaction and a completed turn, a
//! summary that cannot be had leaves the oldest turns out with a note, and
//! a crash mid-compaction redoes it. Each run's log replays to the live
//! state, and no tool result is ever parted from its call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use keel_core::compaction;
use keel_core::message::{AssistantBlock, ContentBlock, Role};
use keel_core::*;

use common::*;

fn small_window() -> ConversationConfig {
    ConversationConfig {
        context_window: 2_000,
        ..ConversationConfig::default()
    }
}

/// The case: 50 tool turns in a 2,000-token window all complete,
/// with compactions in the log and every prompt under the window.
#[test]
fn fifty_tool_turns_in_a_small_window_all_complete() {
    let mut harness = Harness::new(small_window());
    for n in 1..=50 {
        harness.tool_turn(n);
        assert_eq!(harness.completed_turns(), n, "turn {n} did not complete");
        harness.assert_sound();
        assert!(
            compaction::prompt_tokens(harness.working()) < 2_000,
            "turn {n}: the prompt outgrew the window"
        );
    }
    let compactions = harness.compactions();
    assert!(compactions.len() >= 5, "{} compactions", compactions.len());
    for kind in compactions {
        let EventKind::Compacted {
            summary,
            tokens_before,
            tokens_after,
            replaced_messages,
            ..
        } = kind
        else {
            unreachable!()
        };
        assert!(summary.is_some());
        assert!(tokens_after < tokens_before);
        assert!(*replaced_messages > 0);
    }
    // The prompt opens with the latest summary, as a user message.
    let first = &harness.working().messages[0];
    assert_eq!(first.role, Role::User);
    let ContentBlock::Text { text } = &first.content[0] else {
        panic!("the prompt does not open with the summary: {first:?}");
    };
    assert!(text.contains("The user asked for builds"), "{text}");
}

/// A provider's "too long" mid-conversation: keel compacts and the turn
/// completes instead of failing.
#[test]
fn a_prompt_too_long_is_compacted_and_the_turn_completes() {
    let mut harness = Harness::new(ConversationConfig {
        compact_at_percent: 0,
        ..small_window()
    });
    for n in 1..=3 {
        harness.tool_turn(n);
    }
    assert!(harness.compactions().is_empty());
    harness.send("and once more");
    harness.fail(false, true);
    // The oldest turn (four messages) is summarised: the three after it
    // fit in half the threshold, which the plan keeps.
    assert_eq!(harness.summarising, Some(4));
    assert!(harness.summarise_if_asked());
    assert_eq!(harness.compactions().len(), 1);
    harness.respond(vec![AssistantBlock::Text {
        text: "done".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 4);
    harness.assert_sound();
}

/// A summary request the provider refuses: the oldest turns are left out
/// with a note to the model, and the turn goes on.
#[test]
fn a_summary_that_cannot_be_had_leaves_the_oldest_turns_out_with_a_note() {
    let mut harness = Harness::new(ConversationConfig {
        compact_at_percent: 0,
        ..small_window()
    });
    for n in 1..=3 {
        harness.tool_turn(n);
    }
    harness.send("and once more");
    harness.fail(false, true);
    assert!(harness.summarising.is_some());
    harness.summarising = None;
    // The summary request itself is too long.
    harness.fail(false, true);
    let compactions = harness.compactions();
    assert!(matches!(
        compactions[..],
        [EventKind::Compacted { summary: None, .. }]
    ));
    let first = &harness.working().messages[0];
    let ContentBlock::Text { text } = &first.content[0] else {
        panic!("no note: {first:?}");
    };
    assert!(text.contains("left out"), "{text}");
    harness.respond(vec![AssistantBlock::Text {
        text: "done".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 4);
    harness.assert_sound();
}

/// Too long with nothing before the latest turn: nothing can be replaced
/// without parting the turn, so the turn fails with a message that says so,
/// and the conversation takes the next message.
#[test]
fn too_long_with_one_turn_fails_that_turn_clearly() {
    let mut harness = Harness::new(small_window());
    harness.send("a huge paste");
    harness.fail(false, true);
    let failed = harness.log.iter().find_map(|event| match &event.kind {
        EventKind::TurnFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    let error = failed.expect("the turn failed");
    assert!(error.contains("latest turn alone"), "{error}");
    harness.send("something shorter");
    harness.respond(vec![AssistantBlock::Text {
        text: "ok".to_owned(),
    }]);
    assert_eq!(harness.completed_turns(), 1);
    harness.assert_sound();
}

/// A crash while the summary is being written leaves the log as it was
/// (nothing of the summary request is recorded); the restarted
/// conversation compacts again and the turn completes.
#[test]
fn a_crash_during_compaction_redoes_it() {
    let mut harness = Harness::new(small_window());
    let mut n = 0;
    while harness.summarising.is_none() {
        n += 1;
        harness.send(&format!(
            "turn {n}: {}",
            "tell me more about it. ".repeat(12)
        ));
        if harness.summarising.is_some() {
            break;
        }
        harness.respond(vec![AssistantBlock::Text {
            text: "more about it ".repeat(20),
        }]);
    }
    let log_before = harness.log.clone();
    // The process dies: a new life rebuilds from the log.
    let rebuilt = Conversation::replay(&harness.log).unwrap();
    assert!(harness.compactions().is_empty());
    harness.conv = Some(rebuilt);
    harness.summarising = None;
    harness.step(Input::Started);
    assert!(
        harness.summarising.is_some(),
        "the restarted turn compacts again"
    );
    assert_eq!(harness.log[..log_before.len()], log_before[..]);
    assert!(harness.summarise_if_asked());
    harness.respond(vec![AssistantBlock::Text {
        text: "ok".to_owned(),
    }]);
    assert_eq!(harness.compactions().len(), 1);
    assert_eq!(harness.completed_turns(), n);
    harness.assert_sound();
}
