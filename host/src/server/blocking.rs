//! Blocking work of the API's requests, on tokio's blocking pool, within a bound per
//! tenant.

use std::sync::Arc;

use super::{ApiError, ErrorKind, Server};
use crate::tenant::TenantConfig;

/// Requests of one tenant that may wait on the blocking pool at once (a stop waits up to
/// 5 minutes for its savepoint, a submission compiles plugins): one tenant cannot take
/// the pool's threads from the others.
pub const BLOCKING_PER_TENANT: u32 = 8;

/// One of a tenant's [`BLOCKING_PER_TENANT`] places; given back when dropped.
struct BlockingPlace {
    server: Arc<Server>,
    tenant: String,
}

impl BlockingPlace {
    fn take(server: &Arc<Server>, tenant: &TenantConfig) -> Result<BlockingPlace, ApiError> {
        let mut in_progress = server.blocking.lock();
        let n = in_progress.entry(tenant.name.clone()).or_default();
        if *n >= BLOCKING_PER_TENANT {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "tenant '{}' has {n} requests in progress that wait on its jobs or plugins                      (stop, start, submit, cancel, upload…); try again when one has answered",
                    tenant.name
                ),
            ));
        }
        *n += 1;
        Ok(BlockingPlace {
            server: server.clone(),
            tenant: tenant.name.clone(),
        })
    }
}

impl Drop for BlockingPlace {
    fn drop(&mut self) {
        if let Some(n) = self.server.blocking.lock().get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Runs blocking server work of `tenant` on tokio's blocking pool, within the tenant's
/// [`BLOCKING_PER_TENANT`].
pub(super) async fn blocking<T: Send + 'static>(
    server: &Arc<Server>,
    tenant: &TenantConfig,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let place = BlockingPlace::take(server, tenant)?;
    tokio::task::spawn_blocking(move || {
        let _place = place;
        f()
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::internal(anyhow::anyhow!(
            "a request handler failed: {e}"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_has_at_most_its_blocking_places_and_gets_each_back() {
        let engine = Arc::new(
            crate::wasm::WasmEngine::new(crate::wasm::EngineSettings {
                cache_dir: None,
                announce_compiles: false,
            })
            .unwrap(),
        );
        let server = Server::for_worker(crate::tenant::HostConfig::default(), engine);
        let tenant = |name: &str| crate::tenant::HostConfig::default().tenant(name).unwrap();
        let (a, b) = (tenant("a"), tenant("b"));
        let mut held: Vec<_> = (0..BLOCKING_PER_TENANT)
            .map(|_| BlockingPlace::take(&server, &a).unwrap())
            .collect();
        let err = BlockingPlace::take(&server, &a).err().unwrap();
        assert_eq!(err.kind, ErrorKind::Quota);
        assert!(
            err.message
                .contains("tenant 'a' has 8 requests in progress"),
            "{}",
            err.message
        );
        // Another tenant has its own.
        let _b = BlockingPlace::take(&server, &b).unwrap();
        // One answered, one more may wait.
        held.pop();
        held.push(BlockingPlace::take(&server, &a).unwrap());
    }
}
