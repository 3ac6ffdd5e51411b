//! `[cluster]` as a host runs it: the job file's, what the host file adds, and
//! `--cluster` over both.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use rdkafka::ClientConfig;

use crate::job::{ClusterSpec, JobGraph};
use crate::spec::limits;

/// `[cluster]` resolved, with `--cluster` applied.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// The brokers the hosts meet at.
    pub bootstrap: String,
    /// The checkpoint store (a directory or URL).
    pub checkpoints: String,
    /// Partitions of each exchange topic.
    pub exchange_partitions: u32,
    /// Kafka's `session.timeout.ms` of the hosts' membership.
    pub session_timeout: Duration,
    /// This host's local checkpoint folders.
    pub work_dir: std::path::PathBuf,
    /// Further librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// What the names of the job's topics, groups and transactional ids begin with
    /// before `sluice-JOB` (on a server, the tenant's `id_prefix`; else nothing).
    pub name_prefix: String,
}

impl ClusterSettings {
    /// The job's `[cluster]`, with `bootstrap` from the command line when given, and
    /// what the job leaves out from `machine` (the host file's `[cluster]`; its
    /// `properties` under the job's).
    pub fn of(
        graph: &JobGraph,
        bootstrap: Option<&str>,
        machine: Option<&ClusterSpec>,
    ) -> Result<Self> {
        let mut job = graph.cluster.clone().unwrap_or_default();
        // (The host file's were resolved when it was read.)
        job.properties = job
            .properties
            .map(|p| crate::spec::secrets::resolved(&p, &|path| graph.base_dir.join(path)))
            .transpose()
            .context("[cluster]")?;
        let machine = machine.cloned().unwrap_or_default();
        let properties = match (machine.properties, job.properties) {
            (Some(mut m), Some(j)) => {
                m.extend(j);
                Some(m)
            }
            (m, j) => j.or(m),
        };
        let spec = ClusterSpec {
            bootstrap: job.bootstrap.or(machine.bootstrap),
            checkpoints: job.checkpoints.or(machine.checkpoints),
            exchange_partitions: job.exchange_partitions.or(machine.exchange_partitions),
            session_timeout_ms: job.session_timeout_ms.or(machine.session_timeout_ms),
            work_dir: job.work_dir.or(machine.work_dir),
            properties,
        };
        let bootstrap = bootstrap
            .map(str::to_string)
            .or(spec.bootstrap)
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| {
                anyhow!(
                    "no Kafka brokers to meet at: pass --cluster HOST:PORT or set `[cluster] \
                     bootstrap` (in the job file, or the host file's)"
                )
            })?;
        let checkpoints = spec
            .checkpoints
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| {
                anyhow!(
                    "`[cluster] checkpoints` is missing (in the job file, or the host file's): \
                     the storage every host reads the units' checkpoints from (a shared \
                     directory, or s3://, gs://, az://)"
                )
            })?;
        let exchange_partitions = limits::EXCHANGE_PARTITIONS
            .resolve(spec.exchange_partitions)
            .map_err(|e| anyhow!("[cluster]: {e}"))?;
        let session_ms = limits::SESSION_TIMEOUT_MS
            .resolve(
                spec.session_timeout_ms
                    .map(|m| u32::try_from(m.0).unwrap_or(u32::MAX)),
            )
            .map_err(|e| anyhow!("[cluster]: {e}"))?;
        Ok(ClusterSettings {
            bootstrap,
            checkpoints,
            exchange_partitions,
            session_timeout: Duration::from_millis(u64::from(session_ms)),
            work_dir: graph.base_dir.join(
                spec.work_dir
                    .unwrap_or_else(|| format!("{}.cluster-work", graph.name).into()),
            ),
            properties: spec.properties.unwrap_or_default(),
            name_prefix: String::new(),
        })
    }

    /// A librdkafka client configuration for the cluster's brokers.
    pub fn client(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        for (k, v) in &self.properties {
            client.set(k, v);
        }
        client.set("bootstrap.servers", &self.bootstrap);
        client
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::cluster::plan::tests::{CLUSTER, COUNT, KAFKA_SINK, KAFKA_SOURCE, graph};

    #[test]
    fn cluster_settings_name_what_is_missing_or_out_of_range() {
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}[checkpoint]\ninterval_ms = 100\n"
        ));
        let e = ClusterSettings::of(&g, None, None).unwrap_err().to_string();
        assert!(e.contains("--cluster"), "{e}");
        let e = ClusterSettings::of(&g, Some("b:1"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`[cluster] checkpoints` is missing"), "{e}");
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}exchange_partitions = 0\n"
        ));
        let e = ClusterSettings::of(&g, Some("b:1"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exchange_partitions"), "{e}");
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}bootstrap = \"k:9\"\n"
        ));
        let s = ClusterSettings::of(&g, None, None).unwrap();
        assert_eq!(s.bootstrap, "k:9");
        assert_eq!(
            ClusterSettings::of(&g, Some("o:1"), None)
                .unwrap()
                .bootstrap,
            "o:1"
        );
        assert_eq!(s.exchange_partitions, 8);
        assert!(s.work_dir.ends_with("j.cluster-work"));
    }

    #[test]
    fn the_host_files_cluster_fills_in_what_the_job_leaves_out() {
        let machine = ClusterSpec {
            bootstrap: Some("m:1".into()),
            checkpoints: Some("/mnt/shared".into()),
            session_timeout_ms: Some(crate::spec::values::Millis(20_000)),
            work_dir: Some("/var/sluice".into()),
            properties: Some(BTreeMap::from([
                ("security.protocol".into(), "SASL_SSL".into()),
                ("linger.ms".into(), "1".into()),
            ])),
            ..ClusterSpec::default()
        };
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}[checkpoint]\ninterval_ms = 100\n\
             [cluster]\nsession_timeout_ms = 5000\nproperties = {{ \"linger.ms\" = \"9\" }}\n"
        ));
        let s = ClusterSettings::of(&g, None, Some(&machine)).unwrap();
        assert_eq!(s.bootstrap, "m:1");
        assert_eq!(s.checkpoints, "/mnt/shared");
        assert_eq!(
            s.session_timeout,
            Duration::from_secs(5),
            "the job's own win"
        );
        assert_eq!(s.work_dir, Path::new("/var/sluice"));
        assert_eq!(s.properties["security.protocol"], "SASL_SSL");
        assert_eq!(
            s.properties["linger.ms"], "9",
            "the job's properties go over"
        );
        let s = ClusterSettings::of(&g, Some("c:1"), Some(&machine)).unwrap();
        assert_eq!(s.bootstrap, "c:1", "the command line goes over both");
    }
}
