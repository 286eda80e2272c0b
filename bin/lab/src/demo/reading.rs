//! The demo's daemon configuration, its scripting of the fake provider,
//! and how it reads the event stream and the command output it shows.

use super::*;

pub(super) fn config(data_dir: &Path, mock_url: &str) -> anyhow::Result<Config> {
    let data_dir = data_dir
        .to_str()
        .ok_or_else(|| anyhow!("the temporary directory is not UTF-8"))?;
    let settings: HashMap<&str, String> = HashMap::from([
        ("KEEL_DATA_DIR", data_dir.to_owned()),
        ("KEEL_ADDR", "127.0.0.1:0".to_owned()),
        ("KEEL_PROVIDER", "mock".to_owned()),
        ("KEEL_MOCK_URL", mock_url.to_owned()),
        // A demo that fails mid-turn still stops at once.
        ("KEEL_SHUTDOWN_GRACE_MS", "1000".to_owned()),
    ]);
    Ok(Config::load(|name| settings.get(name).cloned(), None)?)
}

/// A frame of the event stream as the demo reads it: which kind, and its
/// data in the API's JSON (the shape `--json` prints).
pub(super) struct DemoFrame {
    /// `snapshot`, `canonical` or `live`.
    pub(super) event: &'static str,
    pub(super) data: Value,
}

impl DemoFrame {
    pub(super) fn of(frame: client::Frame) -> anyhow::Result<DemoFrame> {
        let (event, data) = match frame {
            client::Frame::Snapshot(snapshot) => ("snapshot", serde_json::to_value(snapshot)?),
            client::Frame::Canonical(event) => ("canonical", serde_json::to_value(event)?),
            client::Frame::Live(event) => ("live", serde_json::to_value(event)?),
            // The demo's daemon does not go away under a stream it reads:
            // it drops the stream before a crash.
            client::Frame::Error(error) => {
                bail!("the event stream failed: {}: {}", error.code, error.message)
            }
            client::Frame::Reconnecting { error } => bail!("the event stream broke: {error}"),
        };
        Ok(DemoFrame { event, data })
    }
}

/// The fake provider's script API: `POST /_mock/script` queues replies,
/// one per request, before its default behaviour resumes.
pub(super) async fn push_script(mock_url: &str, entries: Value) -> anyhow::Result<()> {
    let response = keel_api::http::client()
        .post(format!("{mock_url}/_mock/script"))
        .json(&entries)
        .timeout(PATIENCE)
        .send()
        .await
        .context("scripting the fake provider")?;
    let status = response.status();
    ensure!(
        status.is_success(),
        "the fake provider refused the script: {status}: {}",
        response.text().await.unwrap_or_default()
    );
    Ok(())
}

/// A state as the API names it (`awaiting_input`, …).
pub(super) fn state_name(state: ApiState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub(super) fn is_live(frame: &DemoFrame, kind: &str) -> bool {
    frame.event == "live" && frame.data["type"] == kind
}

pub(super) fn is_canonical(frame: &DemoFrame, kind: &str) -> bool {
    frame.event == "canonical" && frame.data["type"] == kind
}

/// The text blocks of an `assistant_message` event, joined.
pub(super) fn text_of(event: &Value) -> String {
    event["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|block| block["type"] == "text")
        .filter_map(|block| block["text"].as_str())
        .collect()
}

/// The process group a `TREE_COMMAND` printed: `process group PGID`.
pub(super) fn group_in(output: &str) -> anyhow::Result<u32> {
    let group = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("process group "))
        .ok_or_else(|| anyhow!("the command did not say its process group: {output:?}"))?;
    group
        .trim()
        .parse()
        .with_context(|| format!("not a process group: {group:?}"))
}

pub(super) fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}
