//! What the connector asks the brokers besides records and offsets: their settings, to
//! explain a refusal with the value that caused it.

use std::future::Future;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

/// The smallest value the brokers that `client` reaches give setting `name` (the
/// brokers of a cluster normally agree), or why it could not be read.
pub(super) fn broker_setting(
    client: &ClientConfig,
    name: &str,
    timeout: Duration,
) -> Result<u64, String> {
    let admin: AdminClient<DefaultClientContext> = client.create().map_err(|e| e.to_string())?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let brokers: Vec<ResourceSpecifier<'_>> = metadata
        .brokers()
        .iter()
        .map(|b| ResourceSpecifier::Broker(b.id()))
        .collect();
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let described =
        block_on(admin.describe_configs(&brokers, &options)).map_err(|e| e.to_string())?;
    described
        .into_iter()
        .filter_map(|r| r.ok())
        .filter_map(|r| r.get(name).and_then(|e| e.value.as_deref()?.parse().ok()))
        .min()
        .ok_or_else(|| format!("no broker told its `{name}`"))
}

/// Runs a future of the admin client (driven by librdkafka's own thread) to its end.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}
