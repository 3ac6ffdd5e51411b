//! The web dashboard in a real browser: headless Chromium driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`; `scripts/test.sh` installs them). A
//! tenant logs in, sees its running job's graph and checkpoints update, stops it with a
//! savepoint; another tenant's job never shows. Screenshots of each view go to
//! `SLUICE_SCREENSHOTS` when it names a folder (the README's come from here).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use sluice::server::model::JobState;
use sluice_tests::{test_dir, throttled_wordcount, write_job};

use crate::server::{ServerProcess, failure_free_output, host_config, wait_for};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// `chromedriver` on a free loopback port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let agent = agent();
        wait_for("chromedriver", Duration::from_secs(30), || {
            agent.get(format!("{url}/status")).call().is_ok()
        });
        Driver { child, url }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// One browser session (W3C WebDriver).
struct Browser {
    agent: ureq::Agent,
    session: String,
}

/// How the key under which WebDriver names an element begins.
const ELEMENT_PREFIX: &str = "element-6066-11e4-";

impl Browser {
    fn open(driver: &Driver) -> Browser {
        let agent = agent();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let answer = call(
            &agent,
            "POST",
            &format!("{}/session", driver.url),
            Some(caps),
        );
        let session = format!(
            "{}/session/{}",
            driver.url,
            answer["sessionId"].as_str().expect("a session id")
        );
        Browser { agent, session }
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        call(
            &self.agent,
            method,
            &format!("{}{path}", self.session),
            body,
        )
    }

    fn go(&self, url: &str) {
        self.send("POST", "/url", Some(json!({ "url": url })));
    }

    fn find(&self, css: &str) -> String {
        let v = self.send(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        // (The W3C name of the key, or the one this ChromeDriver uses.)
        v.as_object()
            .and_then(|o| o.iter().find(|(k, _)| k.starts_with(ELEMENT_PREFIX)))
            .and_then(|(_, id)| id.as_str())
            .unwrap_or_else(|| panic!("no {css}: {v}"))
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.send("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.send(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Runs `script` in the page and returns its value.
    fn eval(&self, script: &str) -> Value {
        self.send(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    fn count(&self, css: &str) -> u64 {
        let script = format!("return document.querySelectorAll({css:?}).length;");
        self.eval(&script).as_u64().unwrap_or(0)
    }

    fn text(&self, css: &str) -> String {
        let script =
            format!("const e = document.querySelector({css:?}); return e ? e.textContent : '';");
        self.eval(&script).as_str().unwrap_or_default().to_string()
    }

    fn accept_alert(&self) {
        self.send("POST", "/alert/accept", Some(json!({})));
    }

    /// A PNG of the page, into `SLUICE_SCREENSHOTS/name` when that is set.
    fn screenshot(&self, name: &str) {
        let png = base64::engine::general_purpose::STANDARD
            .decode(self.send("GET", "/screenshot", None).as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        if let Some(dir) = std::env::var_os("SLUICE_SCREENSHOTS").map(PathBuf::from) {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), png).unwrap();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.agent.delete(&self.session).call();
    }
}

/// A WebDriver call; returns its `value`, failing the test on a WebDriver error.
fn call(agent: &ureq::Agent, method: &str, url: &str, body: Option<Value>) -> Value {
    let response = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        (_, body) => agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(body.unwrap_or(json!({})).to_string()),
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let text = response.body_mut().read_to_string().unwrap();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert!(
        value["value"]["error"].is_null(),
        "{method} {url}: {}",
        value["value"]
    );
    value["value"].clone()
}

/// Whether the browser test can run: Chromium and its driver installed. Under
/// `scripts/test.sh` (`SLUICE_BROWSER_REQUIRED=1`) their absence is a failure.
fn browser_installed() -> bool {
    let installed = Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists();
    if !installed {
        assert!(
            std::env::var_os("SLUICE_BROWSER_REQUIRED").is_none(),
            "SLUICE_BROWSER_REQUIRED is set but {CHROMIUM} or {CHROMEDRIVER} is missing"
        );
        eprintln!(
            "skipped: no Chromium. Run the suite with scripts/test.sh, or install Debian's \
             chromium and chromium-driver"
        );
    }
    installed
}

#[test]
fn a_tenant_watches_and_stops_its_job_in_the_dashboard_and_sees_no_other() {
    if !browser_installed() {
        return;
    }
    let dir = test_dir("dashboard");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let (a, b) = (
        server.client(Some("token-a")),
        server.client(Some("token-b")),
    );
    let job_text = throttled_wordcount(2, 200_000, 500.0);
    let job = write_job(&dir, &job_text);
    let id = a.submit(&job).unwrap().id;
    let other = b.submit(&job).unwrap().id;
    let driver = Driver::start();
    let browser = Browser::open(&driver);
    let until = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(100));
        }
    };

    // Log in with the token form; the job list shows this tenant's job only.
    browser.go(&server.url);
    until("the login form", &|| browser.count("#token") == 1);
    browser.type_into("#token", "token-a");
    browser.click("#login-button");
    until("the job list", &|| browser.count("tr.job") == 1);
    // The header says whose jobs these are.
    until("the tenant's name", &|| browser.text("#who") == "tenant a");
    assert_eq!(browser.count(&format!("tr.job[data-id='{id}']")), 1);
    assert_eq!(browser.count(&format!("tr.job[data-id='{other}']")), 0);
    assert!(
        browser.text("#jobs").contains("killable") && browser.text("#jobs").contains("running")
    );
    until("records read", &|| {
        browser.text(&format!("tr.job[data-id='{id}'] td:nth-child(6)")) != "0"
    });
    // What its sink committed, as of its last checkpoint.
    until("records committed", &|| {
        let committed = browser.text(&format!("tr.job[data-id='{id}'] td.committed"));
        committed != "-" && committed != "0"
    });
    browser.screenshot("jobs.png");

    // The job: its graph (source -> tokenize, count x2, sink), and checkpoints that
    // keep coming while the page is open.
    browser.click(&format!("tr.job[data-id='{id}'] a"));
    until("the graph", &|| browser.count("#graph g.task") == 3);
    // Per operator: tokenize, count and the sink.
    until("the operators", &|| browser.count("tr.operator") == 3);
    // Per subtask: each task's subtasks, with their records and how their time went.
    let subtasks = a.status(&id).unwrap().tasks.len() as u64;
    assert!(subtasks >= 3, "{subtasks} subtasks");
    until("the subtasks", &|| browser.count("tr.subtask") == subtasks);
    assert!(
        browser.text("#subtasks").contains("count (2/2)"),
        "{}",
        browser.text("#subtasks")
    );
    // Each task of the graph coloured by what it did since the last refresh.
    assert_eq!(
        browser.count("#graph g.task.busy, #graph g.task.idle, #graph g.task.backpressured"),
        3
    );
    // Charts of its records per second and of its checkpoints, filling as it runs.
    until("the charts", &|| {
        browser
            .eval("const c = window.sluiceCharts; return !!c && c.throughput.data.length > 2 && c.throughput.data[1].some((v) => v > 0) && c.checkpoints.data[0].length > 0;")
            .as_bool()
            .unwrap_or(false)
    });
    assert_eq!(browser.count("#charts .uplot"), 2);
    // The job file as submitted.
    assert!(
        browser.text("#job-file").contains("[source]"),
        "{}",
        browser.text("#job-file")
    );
    assert!(
        browser.text("#graph").contains("hash"),
        "{}",
        browser.text("#graph")
    );
    until("a checkpoint", &|| browser.count("tr.checkpoint") >= 1);
    let first = browser.text("tr.checkpoint td");
    until("the next checkpoint", &|| {
        browser.text("tr.checkpoint td") != first
    });
    browser.screenshot("job.png");

    // The log pane keeps its place while the page refreshes under it.
    until("a log pane that scrolls", &|| {
        browser
            .eval("const l = document.getElementById('logs'); return l.scrollHeight > l.clientHeight + 20;")
            .as_bool()
            .unwrap_or(false)
    });
    browser.eval(
        "const l = document.getElementById('logs'); l.scrollTop = 10; l.dataset.before = 'yes'; return 0;",
    );
    until("the page to refresh", &|| {
        browser
            .eval("return document.getElementById('logs').dataset.before === undefined;")
            .as_bool()
            .unwrap_or(false)
    });
    assert_eq!(
        browser.eval("return document.getElementById('logs').scrollTop;"),
        json!(10)
    );

    // A savepoint, the job running on; it is listed by name with the command that
    // starts the job from it.
    browser.click("#savepoint");
    browser.accept_alert();
    until("the savepoint in the list", &|| {
        browser.text("#savepoints").contains("sluice start")
    });
    let name = browser.text("tr.savepoint td");
    assert!(
        browser
            .text("#savepoints")
            .contains(&format!("sluice start {id} --savepoint {name}")),
        "{}",
        browser.text("#savepoints")
    );
    assert_eq!(a.status(&id).unwrap().job.state, JobState::Running);

    // Stop with a savepoint, confirmed in a dialog.
    browser.click("#stop");
    browser.accept_alert();
    until("the job stopped", &|| {
        browser.text("#job-state") == "stopped"
    });
    let status = a.status(&id).unwrap();
    assert_eq!(status.job.state, JobState::Stopped);
    assert!(status.savepoint.is_some(), "{status:?}");
    until("the savepoint listed", &|| {
        browser.text("#checkpoints").contains("savepoint")
    });
    // Started again from a savepoint chosen in the list, as its job file edited in the
    // page (the source's rate limit taken out: an upgrade from the savepoint); the edit
    // outlives the page's refreshes.
    until("a button to start from it", &|| {
        browser.count("tr.savepoint button.start-from") >= 1
    });
    browser.eval(
        "const e = document.getElementById('job-file-edit'); e.value = e.value.replace(/\\nrate = [^\\n]*/, ''); e.dispatchEvent(new Event('input')); e.dataset.before = 'yes'; return 0;",
    );
    until("the page to refresh", &|| {
        browser
            .eval("return document.getElementById('job-file-edit').dataset.before === undefined;")
            .as_bool()
            .unwrap_or(false)
    });
    let edited = browser
        .eval("return document.getElementById('job-file-edit').value;")
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !edited.contains("rate = ") && edited.contains("[source]"),
        "{edited}"
    );
    browser.click("tr.savepoint button.start-from");
    browser.accept_alert();
    until("the job running again", &|| {
        browser.text("#job-state") != "stopped"
    });
    wait_for("the job to finish", Duration::from_secs(120), || {
        a.status(&id).unwrap().job.state == JobState::Finished
    });
    // Exactly the output of a run that never stopped (the two count subtasks' lines
    // interleave as they come: compared in order of the lines), and the job file it ran
    // as.
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let output = sorted(&String::from_utf8(a.output(&id, None).unwrap()).unwrap());
    let expected = sorted(&failure_free_output(&job_text));
    assert!(
        output == expected,
        "{} lines of output after the restart, {} in a run without one",
        output.len(),
        expected.len()
    );
    let detail = a.status(&id).unwrap();
    assert!(!detail.job_file.unwrap().contains("rate = "));

    // A job that failed twice before it finished: its exception history.
    let flaky_dir = dir.join("flaky");
    std::fs::create_dir_all(&flaky_dir).unwrap();
    let flaky = write_job(&flaky_dir, &sluice_tests::twice_failing_job());
    let flaky = a.submit(&flaky).unwrap().id;
    wait_for("the flaky job to finish", Duration::from_secs(60), || {
        a.status(&flaky).unwrap().job.state == JobState::Finished
    });
    browser.go(&format!("{}/#/jobs/{flaky}", server.url));
    until("its two failures", &|| browser.count("tr.exception") == 2);
    assert!(
        browser
            .text("#exceptions")
            .contains("deliberate error in process"),
        "{}",
        browser.text("#exceptions")
    );
    browser.eval("document.getElementById('exceptions').scrollIntoView(); return 0;");
    browser.screenshot("failures.png");

    browser.go(&format!("{}/#/plugins", server.url));
    until("the plugins", &|| browser.count("tr.plugin") == 3);
    assert!(browser.text("#plugins").contains("format, emit"));
    browser.screenshot("plugins.png");

    // Another tenant sees its own job, never this one.
    browser.go(&format!("{}/#/logout", server.url));
    until("the login form again", &|| browser.count("#token") == 1);
    browser.type_into("#token", "token-b");
    browser.click("#login-button");
    until("b's job list", &|| browser.count("tr.job") == 1);
    assert_eq!(browser.count(&format!("tr.job[data-id='{other}']")), 1);
    browser.go(&format!("{}/#/jobs/{id}", server.url));
    let refusal = format!("no job '{id}'");
    until("the refusal", &|| browser.text("main").contains(&refusal));
    // Refreshed every second, it stays one line.
    browser.eval(
        "window.refreshes = 0; new MutationObserver(() => window.refreshes++).observe(document.getElementById('view'), { childList: true, characterData: true, subtree: true }); return 0;",
    );
    until("two refreshes", &|| {
        browser
            .eval("return window.refreshes;")
            .as_u64()
            .unwrap_or(0)
            >= 2
    });
    assert_eq!(browser.count("p.error"), 1, "{}", browser.text("main"));
    b.cancel(&other).unwrap();
}
