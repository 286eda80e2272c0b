//! LlmStreamActor: one LLM request. Spawned linked to its ConversationActor
//! for one generation; it loads the images the prompt references, streams
//! the response through `ProviderClient`, sends every delta back as it
//! arrives and ends with one `StreamFinished` or `StreamFailed`.
//!
//! The request runs inside the actor's handler, so killing the actor (how a
//! cancel or an abort stops it) drops the request future, which closes the
//! HTTP connection at once. It never stops itself: the conversation stops it
//! after reading its final report, so a supervision event can never overtake
//! that report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use keel_core::message::{ContentBlock, ImageRef, Message};
use keel_core::wire::{ImageData, PromptRequest, ToolSpec};
use keel_core::{AssistantResponse, Generation, LlmFailure, ModelRef};

use crate::conversation_actor::ConversationMsg;
use crate::image::{image_data, refit_blocking, ImageLimits};
use crate::runtime::{Alive, Shared};

/// Everything one request is built from, owned: the worker outlives the
/// step that started it.
pub(crate) struct StreamRequest {
    pub(crate) model: ModelRef,
    pub(crate) system: Option<String>,
    pub(crate) messages: Vec<Message>,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) max_tokens: u32,
    pub(crate) timeout_ms: u64,
}

pub(crate) struct StreamArgs {
    pub(crate) generation: Generation,
    pub(crate) request: StreamRequest,
    pub(crate) shared: Arc<Shared>,
    pub(crate) report: ActorRef<ConversationMsg>,
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
        let message = match run(args).instrument(span).await {
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
        request,
        shared,
        report,
        ..
    } = args;
    let provider = request.model.provider;
    let images = load_images(&shared, provider, &request.messages).await?;
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
    let result = shared
        .provider
        .stream(provider, &prompt, limit, |delta| {
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

/// The bytes of every image the prompt references, fitted to `provider`'s
/// limits for a request with this many images (they tighten with many).
async fn load_images(
    shared: &Shared,
    provider: keel_core::ProviderKind,
    messages: &[Message],
) -> Result<BTreeMap<String, ImageData>, LlmFailure> {
    let refs: Vec<&ImageRef> = messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            ContentBlock::Image { image } => Some(image),
            _ => None,
        })
        .collect();
    let limits = ImageLimits::for_request(provider, refs.len());
    let mut images = BTreeMap::new();
    for image in refs {
        if images.contains_key(&image.hash) {
            continue;
        }
        let permanent = |message: String| LlmFailure {
            retryable: false,
            retry_after_ms: None,
            message,
        };
        let bytes = shared
            .store
            .get_blob(&image.hash)
            .await
            .map_err(|error| LlmFailure {
                retryable: true,
                retry_after_ms: None,
                message: format!("cannot read image {}: {error}", image.hash),
            })?
            .ok_or_else(|| permanent(format!("image {} is missing from the store", image.hash)))?;
        let data = match refit_blocking(image.clone(), bytes.clone(), limits)
            .await
            .map_err(|error| permanent(format!("image {}: {error}", image.hash)))?
        {
            Some(fitted) => image_data(&fitted.image.media_type, &fitted.bytes),
            None => image_data(&image.media_type, &bytes),
        };
        images.insert(image.hash.clone(), data);
    }
    Ok(images)
}
