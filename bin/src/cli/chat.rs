//! `keel chat`: an interactive session (being built).

use super::Exit;
use crate::client::Client;

pub async fn run(_client: Client, _id: Option<String>, _json: bool) -> anyhow::Result<Exit> {
    anyhow::bail!("keel chat is not built yet")
}
