//! `keel chat`: an interactive session with one conversation. A prompt
//! with line editing and history (rustyline); each line is sent as a
//! message and its turn is streamed as `keel send` shows it; a call that
//! waits for a person is asked inline (approve / deny, or an answer).
//!
//! Ctrl-C while a turn runs cancels it over HTTP and the session goes on;
//! at the prompt the terminal is in raw mode, so rustyline reads Ctrl-C as
//! a key: once warns, twice in a row leaves (as does Ctrl-D). The event
//! stream is followed for the whole session and never gives up: if the
//! daemon restarts, it reconnects and resumes from the last seq it saw.

use std::path::PathBuf;

use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::commands::{self, NewOptions};
use super::output::{self, Paint};
use super::turn::{is_output, tool_input, Ending, Printer, TurnWatch};
use super::Exit;
use keel_api::client::{Client, Events, Frame};
use keel_api::types::{ApiDecisionKind, ApiPendingCall, ApiPendingKind};

/// The prompt for a message.
const PROMPT: &str = "> ";

pub async fn run(client: Client, id: Option<String>, json: bool) -> anyhow::Result<Exit> {
    let paint = Paint::stdout();
    let id = match id {
        Some(id) => {
            // An unknown id, or no daemon, is said before any prompt.
            client.get(&id).await?;
            id
        }
        None => {
            let request = commands::create_request(NewOptions::default())?;
            client.create(&request).await?.id
        }
    };
    let mut session = Session {
        interrupts: signal(SignalKind::interrupt())?,
        client: client.clone(),
        events: client.events(&id, None).with_patience(None),
        id,
        printer: Printer::new(json),
        editor: Some(DefaultEditor::new()?),
        paint,
    };
    println!(
        "{}",
        paint.dim(&format!(
            "conversation {}: Ctrl-C cancels a turn; Ctrl-C twice at the prompt, or Ctrl-D, leaves",
            session.id
        ))
    );
    // The snapshot: the stream is followed from here on, and a call that
    // already waits for a decision is asked first.
    let snapshot = loop {
        if let Frame::Snapshot(snapshot) = session.events.next().await? {
            break snapshot;
        }
    };
    if !snapshot.pending.is_empty() {
        let mut watch = TurnWatch::in_progress(snapshot.last_seq);
        session
            .decide_and_follow(&mut watch, snapshot.pending)
            .await?;
    }
    session.load_history();
    let mut warned = false;
    loop {
        match session.read_line(PROMPT).await? {
            Ok(line) => {
                warned = false;
                let text = line.trim();
                if text.is_empty() {
                    continue;
                }
                if let Some(editor) = session.editor.as_mut() {
                    let _ = editor.add_history_entry(text);
                }
                session.turn(text.to_owned()).await?;
            }
            Err(ReadlineError::Interrupted) if !warned => {
                warned = true;
                println!("{}", paint.dim("(Ctrl-C again, or Ctrl-D, to leave)"));
            }
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => break,
            Err(error) => return Err(error.into()),
        }
    }
    session.save_history();
    Ok(Exit::Ok)
}

struct Session {
    /// SIGINT, listened to for the whole session: a Ctrl-C that comes
    /// while a frame is being printed is kept for the next poll, not lost
    /// between two listeners. (At the prompt the terminal is raw, so
    /// Ctrl-C is a key there, not a signal.)
    interrupts: Signal,
    client: Client,
    id: String,
    events: Events,
    printer: Printer,
    /// Lent to the blocking thread while a line is read.
    editor: Option<DefaultEditor>,
    paint: Paint,
}

impl Session {
    /// Read a line with the editor on a blocking thread (rustyline blocks).
    async fn read_line(&mut self, prompt: &str) -> anyhow::Result<Result<String, ReadlineError>> {
        let Some(mut editor) = self.editor.take() else {
            anyhow::bail!("the line editor is in use");
        };
        let prompt = prompt.to_owned();
        let (editor, line) = tokio::task::spawn_blocking(move || {
            let line = editor.readline(&prompt);
            (editor, line)
        })
        .await?;
        self.editor = Some(editor);
        Ok(line)
    }

    /// Send `text` and follow its turn to its end, asking for decisions on
    /// the way. A refused message (busy, no daemon) is said and the
    /// session goes on.
    async fn turn(&mut self, text: String) -> anyhow::Result<()> {
        let accepted = match self.client.send_text(&self.id, &text).await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("{}", self.paint.red(&format!("error: {error}")));
                return Ok(());
            }
        };
        let mut watch = TurnWatch::new(accepted.seq);
        match self.follow_until_ending(&mut watch).await? {
            Ending::Pending { calls } => self.decide_and_follow(&mut watch, calls).await,
            Ending::Completed | Ending::Failed { .. } | Ending::Interrupted { .. } => Ok(()),
        }
    }

    /// Ask for a decision on each of `calls`, then follow the turn on.
    async fn decide_and_follow(
        &mut self,
        watch: &mut TurnWatch,
        calls: Vec<ApiPendingCall>,
    ) -> anyhow::Result<()> {
        let mut calls = calls;
        loop {
            for call in &calls {
                if !self.decide(call).await? {
                    // Ctrl-C at the question: cancel the turn instead.
                    self.cancel().await;
                    break;
                }
            }
            match self.follow_until_ending(watch).await? {
                Ending::Pending { calls: more } => calls = more,
                Ending::Completed | Ending::Failed { .. } | Ending::Interrupted { .. } => {
                    return Ok(())
                }
            }
        }
    }

    /// Ask about one pending call and send the decision. `false`: the
    /// person pressed Ctrl-C (or Ctrl-D) instead.
    async fn decide(&mut self, call: &ApiPendingCall) -> anyhow::Result<bool> {
        let _ = self.printer.end_line();
        let what = call
            .prompt
            .clone()
            .unwrap_or_else(|| tool_input(&call.input));
        let who = match &call.conversation {
            Some(child) => format!("sub-agent {child}: {}", call.name),
            None => call.name.clone(),
        };
        println!(
            "{}",
            self.paint.yellow(&format!("{who} wants to run: {what}"))
        );
        loop {
            let (decision, text) = match call.kind {
                ApiPendingKind::Approval => {
                    let line = match self.read_line("approve? [y/n] ").await? {
                        Ok(line) => line,
                        Err(_) => return Ok(false),
                    };
                    match line.trim().to_ascii_lowercase().as_str() {
                        "y" | "yes" => (ApiDecisionKind::Approve, None),
                        "n" | "no" => (ApiDecisionKind::Deny, None),
                        _ => continue,
                    }
                }
                ApiPendingKind::Elicitation | ApiPendingKind::ClientExec => {
                    let line = match self.read_line("answer (empty to deny): ").await? {
                        Ok(line) => line,
                        Err(_) => return Ok(false),
                    };
                    if line.trim().is_empty() {
                        (ApiDecisionKind::Deny, None)
                    } else {
                        (ApiDecisionKind::Answer, Some(line))
                    }
                }
            };
            if let Err(error) = self
                .client
                .decide(&self.id, &call.tool_call_id, decision, text, None)
                .await
            {
                eprintln!("{}", self.paint.red(&format!("error: {error}")));
            }
            return Ok(true);
        }
    }

    /// Print frames until the watched turn ends or waits; Ctrl-C cancels
    /// it (and the following goes on to the interruption).
    async fn follow_until_ending(&mut self, watch: &mut TurnWatch) -> anyhow::Result<Ending> {
        let mut spinner = Some(output::spinner("thinking"));
        loop {
            let frame = tokio::select! {
                frame = self.events.next() => frame?,
                _ = self.interrupts.recv() => {
                    if let Some(spinner) = spinner.take() {
                        spinner.finish_and_clear();
                    }
                    self.cancel().await;
                    continue;
                }
            };
            if is_output(&frame) {
                if let Some(spinner) = spinner.take() {
                    spinner.finish_and_clear();
                }
            }
            self.printer.frame(&frame)?;
            if let Some(ending) = watch.observe(&frame) {
                if let Some(spinner) = spinner.take() {
                    spinner.finish_and_clear();
                }
                self.printer.end_line()?;
                return Ok(ending);
            }
        }
    }

    async fn cancel(&mut self) {
        let _ = self.printer.end_line();
        println!("{}", self.paint.dim("cancelling…"));
        if let Err(error) = self.client.cancel(&self.id).await {
            eprintln!("{}", self.paint.red(&format!("error: {error}")));
        }
    }

    fn history_file() -> Option<PathBuf> {
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".keel_history"))
    }

    /// Earlier sessions' lines, if there is a history file.
    fn load_history(&mut self) {
        if let (Some(editor), Some(path)) = (self.editor.as_mut(), Session::history_file()) {
            let _ = editor.load_history(&path);
        }
    }

    fn save_history(&mut self) {
        if let (Some(editor), Some(path)) = (self.editor.as_mut(), Session::history_file()) {
            let _ = editor.save_history(&path);
        }
    }
}
