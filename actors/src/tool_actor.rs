//! ToolActor: one tool call. Spawned linked to its ConversationActor; runs
//! the tool in its handler, forwards output chunks as they come and ends with
//! one `ToolFinished`. A tool that panics becomes an error result here; a
//! tool whose worker dies some other way is reported by the conversation's
//! supervision handler. Killing the actor (cancel) drops the tool's future,
//! and the tool's RAII guards (a bash call's process group) go with it.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use keel_core::message::{ImageRef, ToolCall};
use keel_store::EventLog;

use crate::image::{prepare_blocking, ImageLimits};
use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::metrics;
use crate::process_group::ProcessLedger;
use crate::spawner::Spawner;
use crate::tool::{CallSandbox, GroupNotes, Tool, ToolContext, ToolOutcome, ToolOutput};
use crate::tool_groups::Lease;

pub(crate) struct ToolArgs {
    pub(crate) call: ToolCall,
    pub(crate) tool: Arc<dyn Tool>,
    pub(crate) cwd: PathBuf,
    /// The conversation's `tools_may_leave_cwd`, see [`ToolContext`].
    pub(crate) may_leave_cwd: bool,
    pub(crate) ledger: Option<Arc<ProcessLedger>>,
    /// How the tool starts processes, see [`ToolContext`].
    pub(crate) spawner: Spawner,
    /// Where the tool notes its process groups (the lease's notes).
    pub(crate) groups: GroupNotes,
    /// The call's sandbox, see [`ToolContext`].
    pub(crate) sandbox: CallSandbox,
    /// Where the images a tool returns are stored.
    pub(crate) store: Arc<dyn EventLog>,
    pub(crate) report: Mailbox,
    pub(crate) span: tracing::Span,
}

pub(crate) struct ToolState {
    /// Taken when the call runs.
    args: Option<ToolArgs>,
    /// Held for as long as the worker lives, and dropped with the state:
    /// after the tool's future and everything it held (its process group,
    /// killed on drop). A conversation rebuilt after a crash waits for it
    /// (`tool_groups.rs`).
    _lease: Lease,
}

pub(crate) enum ToolMsg {
    Run,
}

pub(crate) struct ToolActor;

impl Actor for ToolActor {
    type Msg = ToolMsg;
    type State = ToolState;
    type Arguments = (ToolArgs, Lease);

    async fn pre_start(
        &self,
        myself: ActorRef<ToolMsg>,
        (args, lease): (ToolArgs, Lease),
    ) -> Result<ToolState, ActorProcessingErr> {
        myself.cast(ToolMsg::Run)?;
        Ok(ToolState {
            args: Some(args),
            _lease: lease,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ToolMsg>,
        ToolMsg::Run: ToolMsg,
        state: &mut ToolState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(args) = state.args.take() else {
            return Ok(());
        };
        let span = args.span.clone();
        run(args).instrument(span).await;
        Ok(())
    }
}

async fn run(args: ToolArgs) {
    let ToolArgs {
        call,
        tool,
        cwd,
        may_leave_cwd,
        ledger,
        spawner,
        groups,
        sandbox,
        store,
        report,
        span,
    } = args;
    let tool_call_id = call.id.clone();
    let tool_name = call.name.clone();
    let (output, mut chunks) = ToolOutput::channel();
    let context = ToolContext {
        call,
        cwd,
        may_leave_cwd,
        output,
        ledger,
        spawner,
        groups,
        sandbox,
    };
    let forward = |chunk: String| {
        let _ = report.cast(ConversationMsg::ToolOutput {
            tool_call_id: tool_call_id.clone(),
            chunk,
        });
    };
    let running = AssertUnwindSafe(tool.run(context)).catch_unwind();
    tokio::pin!(running);
    let outcome = loop {
        tokio::select! {
            outcome = &mut running => break outcome,
            Some(chunk) = chunks.recv() => forward(chunk),
        }
    };
    while let Ok(chunk) = chunks.try_recv() {
        forward(chunk);
    }
    let mut outcome = outcome.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        tracing::warn!(panic = %why, "tool panicked");
        ToolOutcome::error(format!("the tool panicked: {why}"))
    });
    tracing::debug!(is_error = outcome.is_error, "tool finished");
    metrics::tool_run(&tool_name, outcome.is_error);
    if outcome.is_error {
        span.record("error.type", "tool_error");
        span.record("otel.status_code", "error");
    }
    let images = store_images(store.as_ref(), &mut outcome).await;
    let _ = report.cast(ConversationMsg::ToolFinished {
        tool_call_id,
        outcome,
        images,
    });
}

/// The most images one result keeps; more are left out with a note. Each
/// costs the model about as much as a page of text, on every later turn.
pub(crate) const MAX_RESULT_IMAGES: usize = 8;

/// Check, scale and store the images `outcome` carries, as a user's
/// attachments are (`image.rs`), and hand back what is stored. An image
/// that fails any step is left out of the result and named in its text,
/// so the model knows it was there; the call itself stands.
async fn store_images(store: &dyn EventLog, outcome: &mut ToolOutcome) -> Vec<ImageRef> {
    let uploads = std::mem::take(&mut outcome.images);
    let count = uploads.len();
    let mut stored = Vec::new();
    for (index, upload) in uploads.into_iter().enumerate() {
        let why = if stored.len() == MAX_RESULT_IMAGES {
            format!("a result keeps at most {MAX_RESULT_IMAGES} images")
        } else {
            match prepare_blocking(upload.bytes, upload.media_type, ImageLimits::for_upload()).await
            {
                Ok(prepared) => match store.put_blob(prepared.bytes).await {
                    Ok(_) => {
                        stored.push(prepared.image);
                        continue;
                    }
                    Err(error) => format!("it could not be stored: {error}"),
                },
                Err(problem) => problem.to_string(),
            }
        };
        tracing::warn!(image = index + 1, count, %why, "tool image left out");
        if !outcome.content.is_empty() {
            outcome.content.push('\n');
        }
        outcome
            .content
            .push_str(&format!("[image {} of {count} left out: {why}]", index + 1));
    }
    stored
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use image::{ImageFormat, RgbImage};

    use super::*;
    use crate::image::ImageUpload;

    fn png(width: u32, shade: u8) -> Vec<u8> {
        let mut bytes = std::io::Cursor::new(Vec::new());
        RgbImage::from_pixel(width, 4, image::Rgb([shade, 0, 0]))
            .write_to(&mut bytes, ImageFormat::Png)
            .unwrap();
        bytes.into_inner()
    }

    /// Good images are stored and handed back in order; one that is not
    /// what it claims, and any past the cap, are left out and named in
    /// the text, and the call's outcome otherwise stands.
    #[tokio::test]
    async fn a_tools_images_are_stored_or_named_as_left_out() {
        let store: Arc<dyn EventLog> = Arc::new(keel_store::open_memory().unwrap());
        let mut uploads = vec![
            ImageUpload::new("image/png", png(8, 1)),
            ImageUpload::new("image/png", b"not a picture".to_vec()),
        ];
        uploads.extend(
            (0..MAX_RESULT_IMAGES as u8).map(|n| ImageUpload::new("image/png", png(8, n + 2))),
        );
        let mut outcome = ToolOutcome::ok("two screens").with_images(uploads);

        let stored = store_images(store.as_ref(), &mut outcome).await;

        assert_eq!(stored.len(), MAX_RESULT_IMAGES);
        assert!(outcome.images.is_empty());
        assert!(!outcome.is_error);
        for image in &stored {
            assert_eq!(image.media_type, "image/png");
            assert!(store.get_blob(&image.hash).await.unwrap().is_some());
        }
        let count = MAX_RESULT_IMAGES + 2;
        assert!(
            outcome
                .content
                .starts_with("two screens\n[image 2 of 10 left out: "),
            "{}",
            outcome.content
        );
        assert!(
            outcome.content.ends_with(&format!(
                "\n[image {count} of {count} left out: a result keeps at most {MAX_RESULT_IMAGES} images]"
            )),
            "{}",
            outcome.content
        );
    }
}
