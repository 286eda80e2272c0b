//! The checks after every life and at the end: each log against what the
//! clients were told and acknowledged, conversations coming to rest, and no
//! side effect run twice.

use super::*;

/// The log of `id` from `from` on, page by page.
pub(in crate::drill) async fn read_log(
    client: &Client,
    id: &str,
    from: u64,
) -> Result<Vec<ApiEvent>, ClientError> {
    let mut events = Vec::new();
    let mut from = from;
    loop {
        let page = client.log(id, from, None).await?;
        let empty = page.events.is_empty();
        events.extend(page.events);
        if empty || page.next_from == from {
            return Ok(events);
        }
        from = page.next_from;
    }
}

/// How far a conversation's log has been checked, so that a check after a
/// restart reads only what is new; the final check starts over from seq 1.
#[derive(Debug, Clone)]
pub(in crate::drill) struct Checked {
    pub(in crate::drill) next_seq: u64,
    /// Calls of the latest response without a result yet.
    pub(in crate::drill) open: Vec<String>,
    pub(in crate::drill) answered: HashSet<String>,
    /// The log ends with the conversation's `finished` event (a sub-agent
    /// that completed or failed): nothing more can be appended.
    pub(in crate::drill) finished: bool,
}

impl Default for Checked {
    fn default() -> Self {
        Checked {
            next_seq: 1,
            open: Vec::new(),
            answered: HashSet::new(),
            finished: false,
        }
    }
}

/// Check `id`'s log from where the last check of it stopped (`full`: from
/// seq 1): seqs contiguous, every acknowledged message and every event a
/// client received in it and the same, every `tool_use` answered once
/// before the next response.
pub(in crate::drill) async fn check_log(client: &Client, shared: &Shared, id: &str, full: bool) {
    let mut checked = if full {
        Checked::default()
    } else {
        shared.book().checked.get(id).cloned().unwrap_or_default()
    };
    // What the clients had before the log is read: all of it must be there
    // (what arrives while it is read may be newer than the read).
    let (acked, seen) = {
        let book = shared.book();
        let acked: Vec<u64> = book.acked.get(id).cloned().unwrap_or_default();
        let seen: BTreeMap<u64, Value> = book.seen.get(id).cloned().unwrap_or_default();
        (acked, seen)
    };
    let events = match read_log(client, id, checked.next_seq).await {
        Ok(events) => events,
        Err(error) => {
            shared.violation("the log can be read", Some(id), None, format!("{error}"));
            return;
        }
    };
    let mut passed = 0;
    let mut contiguous = true;
    for (offset, event) in events.iter().enumerate() {
        let expected = checked.next_seq + offset as u64;
        if event.seq != expected {
            shared.violation(
                "seqs are contiguous",
                Some(id),
                Some(event.seq),
                format!("seq {expected} is followed by seq {}", event.seq),
            );
            contiguous = false;
            break;
        }
    }
    if contiguous {
        passed += 1;
    }
    let by_seq: HashMap<u64, &ApiEvent> = events.iter().map(|event| (event.seq, event)).collect();
    for seq in acked.into_iter().filter(|seq| *seq >= checked.next_seq) {
        match by_seq.get(&seq) {
            Some(event) if matches!(event.kind, ApiEventKind::UserMessage { .. }) => passed += 1,
            Some(event) => shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(seq),
                format!(
                    "the acknowledged message's seq holds {:?}",
                    kind_name(event)
                ),
            ),
            None => shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(seq),
                "an acknowledged message is missing from the log".to_owned(),
            ),
        }
    }
    for (seq, received) in seen.range(checked.next_seq..) {
        let stored = by_seq
            .get(seq)
            .and_then(|event| serde_json::to_value(event).ok());
        if stored.as_ref() == Some(received) {
            passed += 1;
        } else {
            shared.violation(
                "every acknowledged event is in the log",
                Some(id),
                Some(*seq),
                format!("a client received {received} but the log has {stored:?}"),
            );
        }
    }
    for event in &events {
        match &event.kind {
            ApiEventKind::AssistantMessage { content, .. } => {
                if !checked.open.is_empty() {
                    shared.violation(
                        "every tool_use has one result before the next request",
                        Some(id),
                        Some(event.seq),
                        format!("a response came while {:?} had no result", checked.open),
                    );
                }
                checked.open = content
                    .iter()
                    .filter_map(|block| match block {
                        ApiContent::ToolUse { id, .. } => Some(id.clone()),
                        _ => None,
                    })
                    .collect();
            }
            ApiEventKind::Resolved {
                tool_call_id, by, ..
            } => {
                if by.as_deref() == Some(DRILL) {
                    passed += 1;
                } else {
                    shared.violation(
                        "only the drill resolves calls",
                        Some(id),
                        Some(event.seq),
                        format!("{tool_call_id} was resolved by {by:?}"),
                    );
                }
            }
            ApiEventKind::ToolResult { tool_call_id, .. } => {
                if let Some(position) = checked.open.iter().position(|call| call == tool_call_id) {
                    checked.open.remove(position);
                    checked.answered.insert(tool_call_id.clone());
                    passed += 1;
                } else {
                    let why = if checked.answered.contains(tool_call_id) {
                        "a second result"
                    } else {
                        "a result for no open call"
                    };
                    shared.violation(
                        "every tool_use has one result before the next request",
                        Some(id),
                        Some(event.seq),
                        format!("{why}: {tool_call_id}"),
                    );
                }
            }
            _ => {}
        }
    }
    if contiguous {
        if let Some(last) = events.last() {
            checked.next_seq = last.seq + 1;
            checked.finished = matches!(last.kind, ApiEventKind::Finished { .. });
        }
    }
    let mut book = shared.book();
    book.checks_passed += passed;
    // What was checked need not be kept.
    let next_seq = checked.next_seq;
    if let Some(acked) = book.acked.get_mut(id) {
        acked.retain(|seq| *seq >= next_seq);
    }
    if let Some(seen) = book.seen.get_mut(id) {
        *seen = seen.split_off(&next_seq);
    }
    book.checked.insert(id.to_owned(), checked);
}

/// Whether `event` ends the turn of a message (or says it got none).
pub(in crate::drill) fn ends_a_turn(event: &ApiEvent) -> bool {
    matches!(
        event.kind,
        ApiEventKind::TurnCompleted { .. }
            | ApiEventKind::TurnFailed { .. }
            | ApiEventKind::TurnInterrupted { .. }
            | ApiEventKind::Unanswered { .. }
    )
}

pub(in crate::drill) fn kind_name(event: &ApiEvent) -> String {
    serde_json::to_value(event)
        .ok()
        .and_then(|value| value.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// Give the approvals still owed and wait for every conversation to rest.
pub(in crate::drill) async fn settle(client: &Client, shared: &Shared, ids: &[String]) {
    let started = Instant::now();
    let mut restless: Vec<String> = ids.to_vec();
    while !restless.is_empty() && started.elapsed() < SETTLE_PATIENCE {
        let mut still = Vec::new();
        for id in restless {
            match client.get(&id).await {
                Ok(detail) if detail.pending.is_empty() && is_at_rest(detail.state) => {}
                Ok(detail) => {
                    for call in &detail.pending {
                        if client
                            .decide(
                                &id,
                                &call.tool_call_id,
                                ApiDecisionKind::Approve,
                                None,
                                Some(DRILL.to_owned()),
                            )
                            .await
                            .is_ok()
                        {
                            shared.book().approvals += 1;
                        }
                    }
                    still.push(id);
                }
                Err(_) => still.push(id),
            }
        }
        restless = still;
        if !restless.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if restless.is_empty() {
        shared.passed(ids.len() as u64);
    }
    for id in restless {
        let state = client
            .get(&id)
            .await
            .map(|detail| state_name(detail.state))
            .unwrap_or_else(|error| error.to_string());
        shared.violation(
            "no conversation stays busy once its work is done",
            Some(&id),
            None,
            format!("still {state} {SETTLE_PATIENCE:?} after the workload stopped"),
        );
    }
}

/// Every side effect ran under one `tool_call_id` per nonce, and that id
/// is the call's in the log. Returns how many calls the logs hold.
pub(in crate::drill) async fn check_effects(
    client: &Client,
    shared: &Shared,
    ids: &[String],
    effects: &Path,
) -> usize {
    // The ids each nonce's command was called with, from the logs.
    let mut calls: HashMap<String, String> = HashMap::new();
    for id in ids {
        let Ok(events) = read_log(client, id, 1).await else {
            continue;
        };
        for event in events {
            if let ApiEventKind::AssistantMessage { content, .. } = event.kind {
                for block in content {
                    if let ApiContent::ToolUse { id, input, .. } = block {
                        let command = input.get("command").and_then(Value::as_str).unwrap_or("");
                        if let Some(nonce) = command
                            .split(|c: char| c.is_whitespace() || c == '"')
                            .find(|word| word.starts_with(NONCE))
                        {
                            calls.insert(nonce.to_owned(), id);
                        }
                    }
                }
            }
        }
    }
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut ran: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for line in text.lines() {
        if let Some((call, nonce)) = line.split_once(' ') {
            ran.entry(nonce).or_default().insert(call);
        }
    }
    let mut passed = 0;
    for (nonce, run_as) in &ran {
        let expected = calls.get(*nonce);
        let only_its_own =
            run_as.len() == 1 && expected.is_some_and(|id| run_as.contains(id.as_str()));
        if only_its_own {
            passed += 1;
        } else {
            shared.violation(
                "no side effect runs twice under different ids",
                None,
                None,
                format!("nonce {nonce} ran as {run_as:?}; the log's call is {expected:?}"),
            );
        }
    }
    shared.passed(passed);
    calls.len()
}
