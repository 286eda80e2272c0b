//! LlmStreamActor: one LLM request. Spawned linked to its ConversationActor
//! for one generation; it loads the images the prompt references, streams
//! the response through `ProviderClient`, sends every delta back as it
//! arrives and ends with one `StreamFinished` or `StreamFailed`.
//!
//! An image of the history that cannot go into the request (its blob is
//! gone or damaged, or it cannot be made to fit the provider) is replaced
//! in this request only by a short note to the model, and the conversation
//! is told (`ImageOmitted`) so that its subscribers hear of it. Failing the
//! request instead would fail every later one too: the image stays in the
//! history, which is the log and is never rewritten.
//!
//! The request runs inside the actor's handler, so killing the actor (how a
//! cancel or an abort stops it) drops the request future, which closes the
//! HTTP connection at once. It never stops itself: the conversation stops it
//! after reading its final report, so a supervision event can never overtake
//! that report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use keel_core::message::{ContentBlock, ImageRef, Message, StopReason};
use keel_core::wire::{EncodedHistory, ImageData, PromptRequest, ToolSpec, ToolSpecs};
use keel_core::ProviderKind;
use keel_core::{AssistantResponse, Generation, LlmFailure, ModelRef};

use crate::image::{image_data, refit_blocking, ImageLimits};
use crate::mailbox::Mailbox;
use crate::message::ConversationMsg;
use crate::metrics::{self, RequestOutcome};
use crate::shared::{Alive, Shared};

/// Everything one request is built from, owned: the worker outlives the
/// step that started it.
pub(crate) struct StreamRequest {
    pub(crate) model: ModelRef,
    pub(crate) system: Option<String>,
    /// The conversation's history, shared with it: the worker lets go of
    /// it before it reports, so the conversation's next change to its
    /// history copies nothing.
    pub(crate) messages: Arc<Vec<Message>>,
    pub(crate) tools: Arc<ToolSpecs>,
    /// MCP servers whose tools join `tools`, listed by the worker (a server
    /// may have to start first, which must not hold up the actor), and
    /// tools a `deny` policy keeps from the model.
    pub(crate) mcp_servers: Vec<String>,
    pub(crate) denied: Vec<String>,
    /// Whose request this is: a server may run one per conversation.
    pub(crate) conversation: keel_core::ConversationId,
    pub(crate) max_tokens: u32,
    pub(crate) timeout_ms: u64,
    /// Where the JSON of the history as earlier requests sent it is kept,
    /// and the history's count of edits (`WorkingSet::history_edits`):
    /// `None` for a request of other messages (a summary's transcript).
    pub(crate) reuse: Option<(Arc<Mutex<EncodedHistory>>, u64)>,
}

pub(crate) struct StreamArgs {
    pub(crate) generation: Generation,
    pub(crate) request: StreamRequest,
    pub(crate) shared: Arc<Shared>,
    pub(crate) report: Mailbox,
    pub(crate) span: tracing::Span,
    /// Last, so that it drops after `shared`.
    pub(crate) _alive: Alive,
}

pub(crate) enum StreamMsg {
    Run,
}

pub(crate) struct LlmStreamActor;

impl Actor for LlmStreamActor {
    type Msg = StreamMsg;
    type State = Option<StreamArgs>;
    type Arguments = StreamArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<StreamMsg>,
        args: StreamArgs,
    ) -> Result<Option<StreamArgs>, ActorProcessingErr> {
        myself.cast(StreamMsg::Run)?;
        Ok(Some(args))
    }

    async fn handle(
        &self,
        _myself: ActorRef<StreamMsg>,
        StreamMsg::Run: StreamMsg,
        state: &mut Option<StreamArgs>,
    ) -> Result<(), ActorProcessingErr> {
        let Some(args) = state.take() else {
            return Ok(());
        };
        let span = args.span.clone();
        let generation = args.generation;
        let report = args.report.clone();
        let provider = args.request.model.provider;
        let result = run(args).instrument(span.clone()).await;
        // A failure is counted by the conversation, once its step decided
        // what the failure leads to (a retry, the fallback, a failed turn).
        if let Ok(response) = &result {
            metrics::llm_request(provider, RequestOutcome::Ok);
            let usage = &response.usage;
            let input = usage.input_tokens
                + usage.cache_creation_input_tokens
                + usage.cache_read_input_tokens;
            metrics::token_usage(provider, input, usage.output_tokens);
        }
        record_outcome(&span, &result);
        let message = match result {
            Ok(response) => ConversationMsg::StreamFinished {
                generation,
                response: Box::new(response),
            },
            Err(failure) => ConversationMsg::StreamFailed {
                generation,
                failure,
            },
        };
        let _ = report.cast(message);
        Ok(())
    }
}

async fn run(args: StreamArgs) -> Result<AssistantResponse, LlmFailure> {
    let StreamArgs {
        generation,
        mut request,
        shared,
        report,
        ..
    } = args;
    if !request.mcp_servers.is_empty() || !request.denied.is_empty() {
        let mut tools: Vec<ToolSpec> = request.tools.to_vec();
        tools.extend(
            shared
                .mcp
                .specs(&request.mcp_servers, &request.conversation)
                .await,
        );
        tools.retain(|spec| !request.denied.contains(&spec.name));
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        request.tools = Arc::new(tools.into());
    }
    let provider = request.model.provider;
    let (images, referenced) =
        load_images(&shared, provider, &mut request.messages, |hash, reason| {
            let _ = report.cast(ConversationMsg::ImageOmitted {
                generation,
                hash,
                reason,
            });
        })
        .await?;
    // How an image is sent may depend on the request (how many it holds),
    // and one left out changes this request's messages alone: a history
    // with images is encoded afresh.
    let reuse = request
        .reuse
        .as_ref()
        .filter(|_| !referenced)
        .map(|(history, edits)| (&**history, *edits));
    let prompt = PromptRequest {
        model: &request.model.model,
        system: request.system.as_deref(),
        messages: &request.messages,
        tools: &request.tools,
        max_tokens: request.max_tokens,
        images: &images,
    };
    tracing::debug!(model = %request.model, n_messages = request.messages.len(), "request sent");
    let limit = (request.timeout_ms > 0).then(|| Duration::from_millis(request.timeout_ms));
    let sent = Instant::now();
    let mut first = true;
    let result = shared
        .provider
        .stream_reusing(provider, &prompt, reuse, limit, |delta| {
            if std::mem::take(&mut first) {
                metrics::llm_first_token(provider, sent.elapsed());
            }
            let _ = report.cast(ConversationMsg::StreamDelta { generation, delta });
        })
        .await;
    match &result {
        Ok(response) => tracing::debug!(stop = ?response.stop_reason, "response complete"),
        Err(failure) => {
            tracing::info!(retryable = failure.retryable, error = %failure.message, "request failed")
        }
    }
    result
}

/// The response attributes of the request's `chat` span, or its
/// `error.type`: `retryable_error` (a network error, a timeout, 429 or
/// 5xx) or `error` (anything retrying cannot fix).
fn record_outcome(span: &tracing::Span, result: &Result<AssistantResponse, LlmFailure>) {
    match result {
        Ok(response) => {
            span.record("gen_ai.response.model", response.model.as_str());
            span.record("gen_ai.usage.input_tokens", response.usage.input_tokens);
            span.record("gen_ai.usage.output_tokens", response.usage.output_tokens);
            // One response, one reason; a string, as `tracing` records no
            // arrays.
            span.record(
                "gen_ai.response.finish_reasons",
                finish_reason(response.stop_reason),
            );
        }
        Err(failure) => {
            let kind = if failure.retryable {
                "retryable_error"
            } else {
                "error"
            };
            span.record("error.type", kind);
            span.record("otel.status_code", "error");
        }
    }
}

/// keel's stop reason as its log spells it (snake_case).
fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::Refusal => "refusal",
        StopReason::PauseTurn => "pause_turn",
        StopReason::Other => "other",
    }
}

/// The bytes of every image the prompt references, fitted to `provider`'s
/// limits for a request with this many images (they tighten with many).
/// An image that cannot be included is replaced in `messages` by a note
/// and reported to `omitted` (its hash, why). Only a failed store read is
/// an error, and a retryable one: the store may answer the next attempt.
async fn load_images(
    shared: &Shared,
    provider: ProviderKind,
    messages: &mut Arc<Vec<Message>>,
    mut omitted: impl FnMut(String, String),
) -> Result<(BTreeMap<String, ImageData>, bool), LlmFailure> {
    let refs: Vec<ImageRef> = messages
        .iter()
        .flat_map(|message| &message.content)
        .flat_map(|block| match block {
            ContentBlock::Image { image } => std::slice::from_ref(image),
            ContentBlock::ToolResult { result } => result.images.as_slice(),
            _ => &[],
        })
        .cloned()
        .collect();
    let referenced = !refs.is_empty();
    let limits = ImageLimits::for_request(provider, refs.len());
    let mut images = BTreeMap::new();
    // Hash to the note that stands in for the image.
    let mut notes = BTreeMap::new();
    for image in refs {
        if images.contains_key(&image.hash) || notes.contains_key(&image.hash) {
            continue;
        }
        match load_image(shared, &image, limits).await? {
            Ok(data) => {
                images.insert(image.hash, data);
            }
            Err(reason) => {
                tracing::warn!(hash = %image.hash, %reason, "image left out of the request");
                notes.insert(image.hash.clone(), omission_note(&image.hash, &reason));
                omitted(image.hash, reason);
            }
        }
    }
    // Only a request that leaves an image out has a history of its own.
    if !notes.is_empty() {
        replace_images(Arc::make_mut(messages).as_mut_slice(), &notes);
    }
    Ok((images, referenced))
}

/// Every image block of `messages` whose hash has a note becomes that note;
/// a tool result's image with a note leaves the result, the note joining
/// its text.
fn replace_images(messages: &mut [Message], notes: &BTreeMap<String, String>) {
    if notes.is_empty() {
        return;
    }
    for block in messages.iter_mut().flat_map(|message| &mut message.content) {
        let note = match block {
            ContentBlock::Image { image } => notes.get(&image.hash).cloned(),
            ContentBlock::ToolResult { result } => {
                result.images.retain(|image| match notes.get(&image.hash) {
                    Some(note) => {
                        result.content.push('\n');
                        result.content.push_str(note);
                        false
                    }
                    None => true,
                });
                None
            }
            _ => None,
        };
        if let Some(text) = note {
            *block = ContentBlock::Text { text };
        }
    }
}

/// One image as the request carries it, or why it cannot be included.
async fn load_image(
    shared: &Shared,
    image: &ImageRef,
    limits: ImageLimits,
) -> Result<Result<ImageData, String>, LlmFailure> {
    let bytes = shared
        .store
        .get_blob(&image.hash)
        .await
        .map_err(|error| LlmFailure {
            retryable: true,
            retry_after_ms: None,
            message: format!("cannot read image {}: {error}", image.hash),
            prompt_too_long: false,
        })?;
    let Some(bytes) = bytes else {
        return Ok(Err("it is missing from the store".to_owned()));
    };
    let data = match refit_blocking(image.clone(), bytes.clone(), limits).await {
        Ok(Some(fitted)) => image_data(&fitted.image.media_type, &fitted.bytes),
        Ok(None) => image_data(&image.media_type, &bytes),
        Err(problem) => return Ok(Err(problem.to_string())),
    };
    Ok(Ok(data))
}

/// What the model reads where an image could not be included: short, with
/// enough of the hash to tell two images apart.
fn omission_note(hash: &str, reason: &str) -> String {
    let short = hash.get(..12).unwrap_or(hash);
    format!("[image {short} could not be included: {reason}]")
}

#[cfg(test)]
mod tests {
    use keel_core::ids::ToolCallId;
    use keel_core::message::{Role, ToolResult};

    use super::*;

    fn image(hash: &str) -> ContentBlock {
        ContentBlock::Image {
            image: ImageRef {
                hash: hash.to_owned(),
                media_type: "image/png".to_owned(),
                width: 1,
                height: 1,
                size: 1,
            },
        }
    }

    #[test]
    fn only_the_images_with_a_note_are_replaced_wherever_they_appear() {
        let gone = "ab".repeat(32);
        let kept = "cd".repeat(32);
        let user = |content| Message {
            role: Role::User,
            content,
        };
        let mut messages = vec![
            user(vec![
                ContentBlock::Text {
                    text: "look".to_owned(),
                },
                image(&gone),
                image(&kept),
            ]),
            user(vec![image(&gone)]),
        ];
        let note = omission_note(&gone, "it is missing from the store");
        assert_eq!(
            note,
            "[image abababababab could not be included: it is missing from the store]"
        );
        let notes = BTreeMap::from([(gone.clone(), note.clone())]);

        replace_images(&mut messages, &notes);

        let text = ContentBlock::Text { text: note };
        assert_eq!(messages[0].content[1], text);
        assert_eq!(messages[0].content[2], image(&kept));
        assert_eq!(messages[1].content, vec![text]);
    }

    #[test]
    fn a_tool_results_image_with_a_note_leaves_the_result_and_the_note_joins_its_text() {
        let gone = "ab".repeat(32);
        let kept = "cd".repeat(32);
        let refs = |hashes: &[&String]| -> Vec<ImageRef> {
            hashes
                .iter()
                .map(|hash| match image(hash) {
                    ContentBlock::Image { image } => image,
                    _ => unreachable!("image() makes image blocks"),
                })
                .collect()
        };
        let mut messages = vec![Message {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                result: ToolResult {
                    tool_call_id: ToolCallId::new("call_1"),
                    content: "two screenshots".to_owned(),
                    is_error: false,
                    images: refs(&[&gone, &kept]),
                },
            }],
        }];
        let note = omission_note(&gone, "it is too large");
        let notes = BTreeMap::from([(gone.clone(), note.clone())]);

        replace_images(&mut messages, &notes);

        let ContentBlock::ToolResult { result } = &messages[0].content[0] else {
            panic!("the result stays a result: {:?}", messages[0].content);
        };
        assert_eq!(result.content, format!("two screenshots\n{note}"));
        assert_eq!(result.images, refs(&[&kept]));
    }
}
