use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;
use crate::tenant::HostConfig;

fn tenant(name: &str) -> TenantConfig {
    let mut tenant = HostConfig::default().tenant(name).unwrap();
    tenant.process_memory_bytes = 256 << 20;
    tenant.max_subtasks = 10;
    tenant.limits.cpu_weight = 3;
    tenant
}

/// A folder laid out as a delegated cgroup v2 with `controllers` available (the kernel's
/// files stand in as plain ones).
fn delegated(controllers: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("cgroup.controllers"), controllers).unwrap();
    fs::write(dir.path().join("cgroup.subtree_control"), "").unwrap();
    fs::write(dir.path().join("cgroup.procs"), "").unwrap();
    dir
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

#[test]
fn a_delegated_cgroup_gets_the_server_in_a_leaf_and_each_worker_its_tenants_limits() {
    let dir = delegated("cpuset cpu io memory hugetlb pids\n");
    // A worker cgroup an earlier server left empty, and one with a process still in it
    // (here: a file in its folder).
    fs::create_dir(dir.path().join("worker-old-0")).unwrap();
    fs::create_dir(dir.path().join("worker-old-1")).unwrap();
    fs::write(dir.path().join("worker-old-1/cgroup.procs"), "77").unwrap();

    let cgroups = Cgroups::take_over(dir.path()).unwrap();
    assert_eq!(
        read(&dir.path().join("server/cgroup.procs")),
        std::process::id().to_string()
    );
    assert_eq!(
        read(&dir.path().join("cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert!(!dir.path().join("worker-old-0").exists());
    assert!(dir.path().join("worker-old-1").exists());
    let said = cgroups.describe();
    assert!(
        said.contains("memory.max (process_memory_mb), pids.max, cpu.weight"),
        "{said}"
    );
    assert!(!said.contains("not available"), "{said}");

    let acme = cgroups.create(&tenant("acme/1")).unwrap();
    let again = cgroups.create(&tenant("acme/1")).unwrap();
    assert_eq!(acme.path(), dir.path().join("worker-acme_1-0"));
    assert_eq!(again.path(), dir.path().join("worker-acme_1-1"));
    assert_eq!(
        read(&acme.path().join("memory.max")),
        (256u64 << 20).to_string()
    );
    assert_eq!(read(&acme.path().join("memory.oom.group")), "1");
    assert_eq!(read(&acme.path().join("pids.max")), "296");
    assert_eq!(read(&acme.path().join("cpu.weight")), "300");
    assert_eq!(acme.oom_kills(), 0);
    fs::write(
        acme.path().join("memory.events"),
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n",
    )
    .unwrap();
    assert_eq!(acme.oom_kills(), 1);
}

#[test]
fn only_the_controllers_a_cgroup_has_are_set_and_the_others_are_named() {
    let dir = delegated("cpu io\n");
    let cgroups = Cgroups::take_over(dir.path()).unwrap();
    assert_eq!(read(&dir.path().join("cgroup.subtree_control")), "+cpu");
    let said = cgroups.describe();
    assert!(said.contains("with cpu.weight (cpu_weight)"), "{said}");
    assert!(
        said.contains("the memory, pids controller(s) are not available"),
        "{said}"
    );
    let worker = cgroups.create(&tenant("t")).unwrap();
    assert_eq!(read(&worker.path().join("cpu.weight")), "300");
    assert!(!worker.path().join("memory.max").exists());
    assert!(!worker.path().join("pids.max").exists());
}

#[test]
fn a_cgroup_that_is_not_delegated_is_left_alone_and_the_reason_given() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("cgroup.controllers"), "memory pids cpu").unwrap();
    let why = Cgroups::take_over(dir.path()).unwrap_err();
    assert!(why.contains("is not delegated to it"), "{why}");
    assert!(why.contains(&dir.path().display().to_string()), "{why}");
    assert!(!dir.path().join("server").exists());
}

/// On the kernel's own cgroup v2 (mounted for the test where the machine lets it, as
/// root): a process started with a worker cgroup's joiner runs in that cgroup, and the
/// cgroup is removed once it has ended.
#[test]
fn a_worker_process_starts_in_its_cgroup_on_the_kernels_hierarchy() {
    let Some(mount) = Cgroup2Mount::new() else {
        eprintln!("skipped: cgroup2 cannot be mounted here (needs root)");
        return;
    };
    let dir = mount
        .path()
        .join(format!("sluice-test-{}", std::process::id()));
    fs::create_dir(&dir).unwrap();
    let cgroups = Cgroups::take_over(&dir).unwrap();
    let worker = cgroups.create(&tenant("victim")).unwrap();
    let joiner = worker.joiner().unwrap();
    let mut command = Command::new("sleep");
    command.arg("30");
    // SAFETY: the closure only writes to a file it holds open.
    unsafe {
        command.pre_exec(move || joiner.join_in_child());
    }
    let mut child = command.spawn().unwrap();
    let in_cgroup = read(Path::new(&format!("/proc/{}/cgroup", child.id())));
    let name = format!("/sluice-test-{}/worker-victim-0", std::process::id());
    assert!(
        in_cgroup
            .lines()
            .any(|l| l.strip_prefix("0::") == Some(&name)),
        "{in_cgroup}"
    );
    let cgroup_path = worker.path().to_path_buf();
    assert!(read(&cgroup_path.join("cgroup.procs")).contains(&child.id().to_string()));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(worker);
    assert!(
        !cgroup_path.exists(),
        "the ended worker's cgroup is removed"
    );
    // Back to the hierarchy's root, so the test's folders can go.
    write(
        &mount.path().join("cgroup.procs"),
        &std::process::id().to_string(),
    )
    .unwrap();
    fs::remove_dir(dir.join("server")).unwrap();
    fs::remove_dir(&dir).unwrap();
}

/// cgroup2 mounted on a temporary folder, unmounted when dropped.
struct Cgroup2Mount(tempfile::TempDir);

impl Cgroup2Mount {
    fn new() -> Option<Cgroup2Mount> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Cgroup2Mount(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Cgroup2Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .args(["-l"])
            .arg(self.0.path())
            .status();
    }
}
