//! Tests of the host configuration's tenants, grants and server settings.

use super::*;

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-tenant-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ref")).unwrap();
    let path = dir.join("host.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_tenants_worker_memory_follows_its_state_bound_unless_set() {
    let path = write(
        "worker-memory",
        r#"
[tenant.small]
tenant_state_mb = 512
[tenant.set]
tenant_state_mb = 512
process_memory_mb = 300
open_files = 100
"#,
    );
    let c = HostConfig::load(&path).unwrap();
    // The default: its state, half again, and 1 GiB.
    assert_eq!(
        c.tenant("other").unwrap().process_memory_bytes,
        (6 << 30) + (1 << 30)
    );
    assert_eq!(c.tenant("other").unwrap().open_files, 4096);
    assert_eq!(
        c.tenant("small").unwrap().process_memory_bytes,
        (768 + 1024) << 20
    );
    let set = c.tenant("set").unwrap();
    assert_eq!((set.process_memory_bytes, set.open_files), (300 << 20, 100));
    // Set in [defaults], it is inherited whatever the tenant's state bound.
    let path = write(
        "worker-memory-defaults",
        "[defaults]\nprocess_memory_mb = 2000\n[tenant.t]\ntenant_state_mb = 64\n",
    );
    let c = HostConfig::load(&path).unwrap();
    assert_eq!(c.tenant("t").unwrap().process_memory_bytes, 2000 << 20);
    for (text, expected) in [
        (
            "[defaults]\nprocess_memory_mb = 0\n",
            "process_memory_mb must be at least 1",
        ),
        (
            "[tenant.t]\nopen_files = 10\n",
            "open_files must be at least 64",
        ),
    ] {
        let err = format!(
            "{:#}",
            HostConfig::load(&write("worker-bad", text)).unwrap_err()
        );
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn tenants_inherit_the_defaults_and_override_them() {
    let path = write(
        "inherit",
        r#"
jobs = ["a.toml"]
[defaults]
memory_mb = 128
call_deadline_ms = 5000
[tenant.acme]
memory_mb = 32
fuel_per_call = 1000000
max_instances = 4
dirs = [{ host = "ref", guest = "/ref" }]
cpu_weight = 3
state_mb = 8
timers = 1000
counters = 10
guest_string_kb = 2
tenant_state_mb = 64
"#,
    );
    let c = HostConfig::load(&path).unwrap();
    assert_eq!(c.jobs, vec![path.parent().unwrap().join("a.toml")]);
    let acme = c.tenant("acme").unwrap();
    assert_eq!(acme.limits.memory_bytes, 32 << 20);
    assert_eq!(acme.limits.call_deadline, Some(Duration::from_secs(5)));
    assert_eq!(acme.limits.fuel_per_call, Some(1_000_000));
    assert_eq!(acme.max_instances, 4);
    assert!(acme.limits.dirs[0].read_only);
    assert_eq!(acme.limits.cpu_weight, 3);
    assert_eq!(
        (acme.limits.max_state_bytes, acme.limits.max_timers),
        (8 << 20, 1000)
    );
    assert_eq!(
        (acme.limits.max_counters, acme.limits.max_guest_string_bytes),
        (10, 2048)
    );
    assert_eq!(acme.max_state_bytes, 64 << 20);
    let other = c.tenant("other").unwrap();
    assert_eq!(other.limits.memory_bytes, 128 << 20);
    assert_eq!(other.limits.cpu_weight, 1);
    assert!(other.limits.dirs.is_empty());
}

#[test]
fn strict_configurations_refuse_unknown_tenants_and_bad_fields_are_errors() {
    let path = write("strict", "strict_tenants = true\n[tenant.acme]\n");
    let err = HostConfig::load(&path)
        .unwrap()
        .tenant("intruder")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("tenant 'intruder' is not configured in"),
        "{err}"
    );
    let path = write("typo", "[defaults]\nmemory = 5\n");
    let err = HostConfig::load(&path).unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown field `memory`"),
        "{err:#}"
    );
    let path = write(
        "nodir",
        "[tenant.a]\ndirs = [{ host = \"missing\", guest = \"/x\" }]\n",
    );
    let err = format!("{:#}", HostConfig::load(&path).unwrap_err());
    assert!(
        err.contains("[tenant.a]") && err.contains("no such directory"),
        "{err}"
    );
}

#[test]
fn the_cluster_table_resolves_its_paths_against_the_host_file() {
    let path = write(
        "cluster",
        "[cluster]\nbootstrap = \"k:1\"\ncheckpoints = \"store\"\nwork_dir = \"work\"\n",
    );
    let c = HostConfig::load(&path).unwrap().cluster.unwrap();
    let base = path.parent().unwrap();
    assert_eq!(c.bootstrap.as_deref(), Some("k:1"));
    assert_eq!(c.checkpoints.as_deref(), base.join("store").to_str());
    assert_eq!(c.work_dir, Some(base.join("work")));
    let path = write(
        "cluster-url",
        "[cluster]\ncheckpoints = \"s3://bucket/jobs\"\n",
    );
    let c = HostConfig::load(&path).unwrap().cluster.unwrap();
    assert_eq!(c.checkpoints.as_deref(), Some("s3://bucket/jobs"));
    let e = HostConfig::load(&write("cluster-bad", "[cluster]\nbrokers = \"k:1\"\n")).unwrap_err();
    assert!(
        format!("{e:#}").contains("unknown field `brokers`"),
        "{e:#}"
    );
}

#[test]
fn kafka_grants_are_read_per_tenant_and_checked() {
    let path = write(
        "kafka",
        "[tenant.acme.kafka]\nbootstrap = \"k1:9092, k2:9092\"\nread = [\"acme\\\\..*\"]\n\
         write = [\"out\"]\nproperties = { \"sasl.username\" = \"acme\" }\n\
         checkpoints = \"stores/acme\"\n[tenant.b]\n",
    );
    let c = HostConfig::load(&path).unwrap();
    let grant = c.tenant("acme").unwrap().kafka.unwrap();
    assert_eq!(grant.bootstrap, ["k1:9092", "k2:9092"]);
    assert_eq!(grant.id_prefix, "acme.");
    assert!(grant.may_read("acme.clicks") && !grant.may_read("acmeXclicks"));
    assert!(
        !grant.may_read("b.acme.clicks"),
        "patterns match whole names"
    );
    assert!(grant.may_write("out") && !grant.may_write("out2"));
    assert_eq!(grant.properties["sasl.username"], "acme");
    // Secrets from a file next to the host file, or from the environment.
    let with_secrets = write(
        "kafka-secrets",
        "[tenant.acme.kafka]\nbootstrap = \"k1:9092\"\nproperties = { \"sasl.password\" = \
         \"${file:acme.password}\", \"sasl.username\" = \"${env:SLUICE_TENANT_TEST_NO_SUCH_VAR}\" }\n",
    );
    let password = with_secrets.parent().unwrap().join("acme.password");
    std::fs::write(&password, "pw-from-file\n").unwrap();
    let e = format!("{:#}", HostConfig::load(&with_secrets).unwrap_err());
    assert!(
        e.contains("tenant 'acme'") && e.contains("SLUICE_TENANT_TEST_NO_SUCH_VAR"),
        "{e}"
    );
    std::fs::write(
        &with_secrets,
        std::fs::read_to_string(&with_secrets)
            .unwrap()
            .replace("${env:SLUICE_TENANT_TEST_NO_SUCH_VAR}", "acme"),
    )
    .unwrap();
    let secret = HostConfig::load(&with_secrets)
        .unwrap()
        .tenant("acme")
        .unwrap()
        .kafka
        .unwrap();
    assert_eq!(secret.properties["sasl.password"], "pw-from-file");
    let store = path.parent().unwrap().join("stores/acme");
    assert_eq!(grant.checkpoints.as_deref(), store.to_str());
    assert_eq!(c.tenant("b").unwrap().kafka, None);
    // A store reached through a symbolic link is the store it links to.
    let bad = std::env::temp_dir().join(format!("sluice-tenant-kafka-bad-{}", std::process::id()));
    std::fs::create_dir_all(bad.join("stores/a")).unwrap();
    let _ = std::os::unix::fs::symlink(bad.join("stores/a"), bad.join("link-to-a"));
    for (text, expected) in [
        (
            "[defaults.kafka]\nbootstrap = \"k:1\"\n",
            "`kafka` belongs to a [tenant.NAME] table",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\nread = [\"(\"]\n",
            "topic pattern \"(\" is not a regular expression",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \" \"\n",
            "must name the brokers",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\nid_prefix = \"a\"\n\
             [tenant.ab.kafka]\nbootstrap = \"k:1\"\n",
            "id_prefix \"a\" begins [tenant.ab.kafka] id_prefix \"ab.\"",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"s3://b/t\"\n\
             [tenant.b.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"s3://b/t/b\"\n",
            "checkpoints \"s3://b/t/\" holds [tenant.b.kafka] checkpoints",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \" \"\n",
            "`checkpoints` must name a directory or a URL",
        ),
        // Another spelling of a's store, or of a folder inside it, is a's store.
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"S3://B/t\"\n\
             [tenant.b.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"s3://b/x/../t/b\"\n",
            "each tenant's checkpoint store must be its own",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"stores/a\"\n\
             [tenant.b.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"stores/b/../a/./b\"\n",
            "each tenant's checkpoint store must be its own",
        ),
        (
            "[tenant.a.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"stores/a\"\n\
             [tenant.b.kafka]\nbootstrap = \"k:1\"\ncheckpoints = \"link-to-a/b\"\n",
            "each tenant's checkpoint store must be its own",
        ),
    ] {
        let err = format!(
            "{:#}",
            HostConfig::load(&write("kafka-bad", text)).unwrap_err()
        );
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn server_settings_tokens_and_quotas_are_read_and_checked() {
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let path = write(
        "server",
        &format!(
            "[server]\naddress = \"127.0.0.1:9000\"\ndir = \"reg\"\nmax_upload_mb = 2\n\
             keep_ended_jobs = 7\nkeep_ended_minutes = 2\n\
             [defaults]\nmax_jobs = 3\nmax_disk_mb = 9\n[tenant.acme]\ntoken_sha256 = \"{hash}\"\n\
             max_plugin_mb = 5\nmax_subtasks = 11\n"
        ),
    );
    let c = HostConfig::load(&path).unwrap();
    assert_eq!(c.server.address, "127.0.0.1:9000");
    assert_eq!(c.server.dir, path.parent().unwrap().join("reg"));
    assert_eq!(c.server.max_upload_bytes, 2 << 20);
    let acme = c.tenant("acme").unwrap();
    assert_eq!(acme.token_sha256.unwrap()[..2], [0x9f, 0x86]);
    assert_eq!((acme.max_jobs, acme.max_plugin_bytes), (3, 5 << 20));
    assert_eq!((acme.max_subtasks, acme.max_disk_bytes), (11, 9 << 20));
    assert_eq!(c.tenant("other").unwrap().max_subtasks, 2000);
    assert_eq!(c.server.keep_ended_jobs, 7);
    assert_eq!(c.server.keep_ended_for, Duration::from_secs(120));
    assert_eq!(c.tenant("other").unwrap().token_sha256, None);

    for (text, expected) in [
        (
            "[tenant.a]\ntoken_sha256 = \"abc\"\n",
            "must be 64 hex digits",
        ),
        (
            "[defaults]\ntoken_sha256 = \"x\"\n",
            "belongs to a [tenant.NAME] table",
        ),
        ("[server]\naddress = \"nowhere\"\n", "[server]"),
    ] {
        let err = format!(
            "{:#}",
            HostConfig::load(&write("bad-server", text)).unwrap_err()
        );
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn the_budget_refuses_instances_past_the_maximum_and_releases_them() {
    let budget = InstanceBudget::default();
    let tenant = TenantConfig {
        name: "t".into(),
        max_instances: 5,
        ..HostConfig::default().tenant("t").unwrap()
    };
    let a = budget.reserve(&tenant, 3, "a").unwrap();
    let err = budget.reserve(&tenant, 3, "b").unwrap_err();
    assert!(
        err.to_string().contains("tenant 't' has 3 of its 5 in use"),
        "{err}"
    );
    drop(a);
    assert_eq!(budget.in_use("t"), 0);
    let _b = budget.reserve(&tenant, 3, "b").unwrap();
}
