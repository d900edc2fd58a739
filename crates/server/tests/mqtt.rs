//! MQTT printers end to end, on SQLite and PostgreSQL: the real broker
//! (`TestApp`), a real Mosquitto that each test starts on a free port with the password
//! and ACL files the broker writes, and simulated printers (`printer-sim`'s MQTT mode)
//! connecting with the credentials of their creation answer. Judged by the paper log and
//! the tasks' states: printed once, never twice, nothing lost.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Backend, TestApp};
use onceprint_printer_sim::mqtt::{MqttPrinter, MqttSimConfig, Protocol, Shared};
use onceprint_printer_sim::{FaultUpdate, Faults};
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

const BROKER_USER: &str = "onceprint-test-broker";
const BROKER_PASSWORD: &str = "broker-secret-for-tests";

/// A Mosquitto of the test's own, on a free loopback port, reading the files the broker
/// writes into `dir`.
struct Mosquitto {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn mosquitto_exe() -> Option<PathBuf> {
    ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

impl Mosquitto {
    fn new(dir: &Path) -> Mosquitto {
        Mosquitto { port: free_port(), dir: dir.to_owned(), child: None }
    }

    /// Starts it once the broker has written its files.
    async fn start(&mut self) {
        let exe = mosquitto_exe().expect("mosquitto is installed (.ci/run installs it)");
        wait_until(Duration::from_secs(10), "the broker wrote the MQTT files", || async {
            self.dir.join("passwd").exists() && self.dir.join("acl").exists()
        })
        .await;
        let conf = self.dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                // `user root`: when started as root Mosquitto would switch to its own user,
                // which cannot read the test's private temporary directory.
                "user root\nlistener {port} 127.0.0.1\nallow_anonymous false\npassword_file {dir}/passwd\nacl_file {dir}/acl\n\
                 persistence false\nmax_queued_messages 10000\nlog_dest stderr\nlog_type error\nlog_type warning\n",
                port = self.port,
                dir = self.dir.display()
            ),
        )
        .expect("mosquitto.conf");
        let child = Command::new(exe)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        std::fs::write(self.dir.join("mosquitto.pid"), child.id().to_string()).expect("pid file");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(10), "mosquitto listens", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
    }

    /// `kill -9`: whatever it held in memory is gone (persistence is off).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn wait_until<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < within, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Short timings so that every deadline passes within a test.
fn fast(port: u16, dir: &Path) -> HttpConfig {
    let mut c = HttpConfig::default();
    c.delivery.sweep_interval_ms = 50;
    c.delivery.recheck_ms = 50;
    c.push.interval_ms = 50;
    // No sweep of every store within a test: whatever goes out, goes out because its
    // store was signalled (a commit, a result, a device back) or had a deadline due.
    c.push.sweep_ms = 3_600_000;
    c.push.recheck_after_ms = 300;
    c.push.doubt_after_ms = 60_000;
    for p in c.intake.policies.types.values_mut() {
        p.backoff.initial_ms = 100;
        p.backoff.cap_ms = 300;
        p.backoff.jitter = 0.0;
        p.max_attempts = 50;
    }
    let mut m = onceprint_mqtt::MqttSettings::from_url(
        &format!("mqtt://127.0.0.1:{port}"),
        Some(BROKER_USER.into()),
        Some(BROKER_PASSWORD.into()),
    )
    .expect("url");
    m.acl_dir = Some(dir.to_owned());
    m.reload_pid_file = Some(dir.join("mosquitto.pid"));
    m.acl_interval_ms = 100;
    m.resend_after_ms = 1_000;
    m.star_unknown_after_ms = 1_500;
    c.mqtt = Some(m);
    c
}

/// A broker, its Mosquitto, and a tenant with store s1.
struct World {
    app: TestApp,
    mosquitto: Mosquitto,
    key: String,
    _dir: tempfile::TempDir,
}

async fn world(backend: Backend) -> Option<World> {
    mosquitto_exe().expect("mosquitto is installed (.ci/run installs it)");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut mosquitto = Mosquitto::new(dir.path());
    let app = TestApp::spawn_with(backend, fast(mosquitto.port, dir.path())).await?;
    mosquitto.start().await;
    let a = app.post("/v1/tenants", common::ADMIN, json!({"id": "t1", "name": "Tenant"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let key = a.body["api_key"].as_str().expect("api_key").to_owned();
    let a = app.post("/v1/stores", &key, json!({"id": "s1", "name": "Main street"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    Some(World { app, mosquitto, key, _dir: dir })
}

/// Registers an MQTT printer; returns its login.
async fn printer(w: &World, id: &str, transport: Value) -> (String, String) {
    let a = w.app.post("/v1/printers", &w.key, json!({"id": id, "store_id": "s1", "transport": transport})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let c = &a.body["credentials"];
    (c["username"].as_str().expect("username").into(), c["password"].as_str().expect("password").into())
}

fn device(id: &str) -> Value {
    json!({"kind": "mqtt", "protocol": "onceprint", "device_id": id})
}

fn star(mac: &str) -> Value {
    json!({"kind": "mqtt", "protocol": "cloudprnt", "mac": mac})
}

async fn sim(w: &World, protocol: Protocol, device: &str, login: (String, String), faults: Faults) -> MqttPrinter {
    let config = match protocol {
        // A Star printer is set up with the server URL and its HTTP login only; it takes
        // its MQTT server and login from the broker's settings answer.
        Protocol::Cloudprnt => {
            MqttSimConfig::cloudprnt(&format!("{}/cloudprnt", w.app.base), device, &login.0, &login.1)
        }
        Protocol::Onceprint => MqttSimConfig::onceprint("127.0.0.1", w.mosquitto.port, device, &login.0, &login.1),
    };
    MqttPrinter::start(MqttSimConfig { faults, ..config }).await.expect("simulated printer")
}

/// Submits a text task to `printer`; returns its id.
async fn submit(w: &World, printer: &str, biz_no: &str) -> String {
    let a = w
        .app
        .submit(
            &w.key,
            json!({"biz_no": biz_no, "printer_id": printer, "content": {"type": "text", "text": format!("order {biz_no}\n")}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("task_id").to_owned()
}

async fn task(w: &World, id: &str) -> Value {
    let a = w.app.get(&format!("/v1/print-tasks/{id}"), &w.key).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body
}

async fn wait_state(w: &World, id: &str, state: &str, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        let t = task(w, id).await;
        if t["state"] == state {
            return t;
        }
        assert!(start.elapsed() < within, "task {id} did not reach {state}: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often each text was printed.
fn copies(p: &MqttPrinter, text: &str) -> usize {
    p.jobs().all().iter().filter(|j| j.text.contains(text)).count()
}

per_backend!(
    an_mqtt_printer_needs_an_mqtt_server,
    a_device_prints_each_task_once_and_reports_its_status,
    a_star_printer_prints_once_and_a_repeated_token_goes_to_a_person,
    a_star_printer_power_cycled_after_a_job_is_in_doubt_never_sent_it_again,
    an_error_after_printing_goes_to_a_person_on_every_protocol,
    a_station_moves_on_from_an_mqtt_printer_that_left,
    a_star_job_whose_fate_a_restarted_broker_cannot_know_goes_to_a_person,
    paper_out_retries_with_the_reason_and_prints_once_after_refill,
    a_crash_after_receiving_is_in_doubt_and_never_printed_twice,
    jobs_and_results_delivered_twice_print_once,
    a_lost_result_is_answered_from_the_journal,
    the_mqtt_server_killed_mid_stream_loses_nothing_and_prints_nothing_twice,
    the_broker_restarted_mid_stream_prints_nothing_twice,
    devices_are_isolated_and_a_result_for_another_printer_is_refused,
    a_result_is_acknowledged_only_once_it_is_durable,
    a_star_printer_learns_the_mqtt_server_and_its_login_from_its_server_settings,
    a_star_printer_in_mqtt_mode_fetches_its_url_jobs_and_prints_each_once,
    a_star_printer_out_of_paper_waits_and_prints_once_after_refill,
    idle_devices_in_many_stores_each_get_their_own_ticket_once,
    tickets_committed_while_the_mqtt_server_is_down_go_out_once_it_is_back,
);

async fn an_mqtt_printer_needs_an_mqtt_server(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let key = app.tenant("t1").await;
    let a = app.post("/v1/printers", &key, json!({"id": "m1", "store_id": "s1", "transport": device("dev-1")})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--mqtt-url"), "{message}");
    // Editing a printer to MQTT is refused the same way, and changes nothing.
    let a =
        app.call("PATCH", "/v1/printers/p1", Some(&key), Some(json!({"transport": star("00:11:62:aa:bb:cc")}))).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");
    let p = app.get("/v1/printers/p1", &key).await;
    assert_eq!(p.body["transport"]["kind"], "agent", "{p:?}");
    app.stop().await;
}

async fn a_device_prints_each_task_once_and_reports_its_status(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    // Another tenant cannot take the same device.
    let other = w.app.post("/v1/tenants", common::ADMIN, json!({"id": "t2", "name": "Other"})).await;
    let other_key = other.body["api_key"].as_str().unwrap_or_default().to_owned();
    w.app.post("/v1/stores", &other_key, json!({"id": "s1", "name": "x"})).await;
    let taken = w
        .app
        .post("/v1/printers", &other_key, json!({"id": "m9", "store_id": "s1", "transport": device("dev-1")}))
        .await;
    assert_eq!(taken.status, StatusCode::BAD_REQUEST, "{taken:?}");
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults::default()).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(submit(&w, "m1", &format!("A{i}")).await);
    }
    for id in &ids {
        let t = wait_state(&w, id, "printed", Duration::from_secs(20)).await;
        assert_eq!(t["attempts"], 1, "{t}");
    }
    for i in 0..5 {
        assert_eq!(copies(&sim, &format!("order A{i}")), 1, "{:?}", sim.jobs().all());
    }
    let p = w.app.get("/v1/printers/m1", &w.key).await;
    assert_eq!((p.body["online"].as_bool(), p.body["last_error"].is_null()), (Some(true), true), "{p:?}");
    assert!(p.body["last_seen_at"].is_string(), "{p:?}");
    // The last will marks it offline.
    sim.shutdown().await;
    wait_until(Duration::from_secs(20), "the will marks the printer offline", || async {
        let p = w.app.get("/v1/printers/m1", &w.key).await;
        p.body["online"] == false && p.body["last_error"] == "offline"
    })
    .await;
    w.app.stop().await;
}

async fn a_star_printer_prints_once_and_a_repeated_token_goes_to_a_person(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:aa:bb:cc";
    let login = printer(&w, "star", star("00:11:62:AA:BB:CC")).await;
    let sim = sim(&w, Protocol::Cloudprnt, mac, login, Faults::default()).await;
    let first = submit(&w, "star", "S1").await;
    wait_state(&w, &first, "printed", Duration::from_secs(20)).await;
    assert_eq!(sim.jobs().count(), 1);
    // The MQTT server delivers the next job twice (QoS 1): the printer prints it once and
    // answers the repeated token "duplicate, not printed"; the recorded result stands.
    sim.faults().update_all(FaultUpdate { receive_twice: Some(1), ..FaultUpdate::default() });
    let second = submit(&w, "star", "S2").await;
    wait_state(&w, &second, "printed", Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(task(&w, &second).await["state"], "printed");
    assert_eq!(sim.jobs().count(), 2, "printed once: {:?}", sim.jobs().all());
    sim.shutdown().await;
    w.app.stop().await;
}

/// A Star printer that is switched off after it was handed a job, and comes back without
/// a result, may have printed it: in doubt, and the job is never published again — a
/// printer whose remembered job tokens did not survive the power cycle would print it a
/// second time.
async fn a_star_printer_power_cycled_after_a_job_is_in_doubt_never_sent_it_again(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:aa:bb:cc";
    let login = printer(&w, "star", star("00:11:62:AA:BB:CC")).await;
    let faults = Faults { crash_mid_job: 1, power_cycle_forgets: true, ..Faults::default() };
    let sim = sim(&w, Protocol::Cloudprnt, mac, login, faults).await;
    let id = submit(&w, "star", "S1").await;
    let t = wait_state(&w, &id, "in_doubt", Duration::from_secs(30)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    let events = w.app.get(&format!("/v1/print-tasks/{id}/events"), &w.key).await;
    assert!(events.body.to_string().contains("came back without a result"), "{}", events.body);
    // Back online and reporting 200 OK for a while: the job is not published again.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(copies(&sim, &format!("{id}.1")), 0, "job tokens are not in the text");
    assert_eq!(sim.jobs().count(), 1, "printed once: {:?}", sim.jobs().all());
    // The lane moved on.
    let next = submit(&w, "star", "S2").await;
    wait_state(&w, &next, "printed", Duration::from_secs(20)).await;
    assert_eq!(sim.jobs().count(), 2, "{:?}", sim.jobs().all());
    sim.shutdown().await;
    w.app.stop().await;
}

/// What a failed print-result after printing says is classified by Star's table, like a
/// CloudPRNT HTTP confirmation: a code Star does not document may have printed.
async fn an_error_after_printing_goes_to_a_person_on_every_protocol(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let star_login = printer(&w, "star", star("00:11:62:AA:BB:CC")).await;
    let dev_login = printer(&w, "m1", device("dev-1")).await;
    let faults = Faults { error_after_print: 1, ..Faults::default() };
    let star_sim = sim(&w, Protocol::Cloudprnt, "00:11:62:aa:bb:cc", star_login, faults).await;
    let dev_sim = sim(&w, Protocol::Onceprint, "dev-1", dev_login, faults).await;
    let s = submit(&w, "star", "E1").await;
    let d = submit(&w, "m1", "E2").await;
    for id in [&s, &d] {
        let t = wait_state(&w, id, "in_doubt", Duration::from_secs(20)).await;
        assert_eq!(t["attempts"], 1, "{t}");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(star_sim.jobs().count(), 1, "{:?}", star_sim.jobs().all());
    assert_eq!(copies(&dev_sim, "order E2"), 1, "{:?}", dev_sim.jobs().all());
    star_sim.shutdown().await;
    dev_sim.shutdown().await;
    w.app.stop().await;
}

/// An MQTT printer that left (its last will) takes no work, and says nothing more: its
/// station's tickets move to the next printer after the station's threshold, and
/// print once there.
async fn a_station_moves_on_from_an_mqtt_printer_that_left(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let first = printer(&w, "m1", device("dev-1")).await;
    let second = printer(&w, "m2", device("dev-2")).await;
    let s = w
        .app
        .post(
            "/v1/stations",
            &w.key,
            json!({"id": "hot", "store_id": "s1", "printers": ["m1", "m2"], "failover_after_ms": 1000}),
        )
        .await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let gone = sim(&w, Protocol::Onceprint, "dev-1", first, Faults::default()).await;
    let backup = sim(&w, Protocol::Onceprint, "dev-2", second, Faults::default()).await;
    wait_until(Duration::from_secs(10), "m1 online", || async {
        w.app.get("/v1/printers/m1", &w.key).await.body["online"] == true
    })
    .await;
    gone.shutdown().await;
    wait_until(Duration::from_secs(10), "m1 offline (its will)", || async {
        w.app.get("/v1/printers/m1", &w.key).await.body["last_error"] == "offline"
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let body = json!({"biz_no": format!("H{i}"), "station_id": "hot",
                          "content": {"type": "text", "text": format!("order H{i}\n")}});
        let a = w.app.submit(&w.key, body).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        ids.push(a.body["task_id"].as_str().expect("id").to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        let t = wait_state(&w, id, "transferred", Duration::from_secs(20)).await;
        let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
        let s = wait_state(&w, &succ, "printed", Duration::from_secs(20)).await;
        assert_eq!(s["printer_id"], "m2", "{s}");
        assert_eq!(copies(&backup, &format!("order H{i}")), 1, "{:?}", backup.jobs().all());
    }
    backup.shutdown().await;
    w.app.stop().await;
}

/// A Star printer's job in flight when the broker restarted: the new process does not
/// know whether the MQTT server took it, and never sends it again (a repeated token may
/// print twice). No result comes (it was lost on the way): the job goes to a person within
/// `star_unknown_after_ms`, not after `push_doubt_after_ms`, and the lane moves on.
async fn a_star_job_whose_fate_a_restarted_broker_cannot_know_goes_to_a_person(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "star", star("00:11:62:AA:BB:CC")).await;
    let faults = Faults { lose_result: 1, ..Faults::default() };
    let sim = sim(&w, Protocol::Cloudprnt, "00:11:62:aa:bb:cc", login, faults).await;
    let id = submit(&w, "star", "R1").await;
    wait_until(Duration::from_secs(20), "printed on paper", || async { sim.jobs().count() == 1 }).await;
    let World { app, mosquitto, key, _dir } = w;
    let config = fast(mosquitto.port, _dir.path());
    let app = app.restart(config).await;
    let w = World { app, mosquitto, key, _dir };
    let t = wait_state(&w, &id, "in_doubt", Duration::from_secs(20)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    let events = w.app.get(&format!("/v1/print-tasks/{id}/events"), &w.key).await;
    assert!(events.body.to_string().contains("earlier broker process"), "{}", events.body);
    let next = submit(&w, "star", "R2").await;
    wait_state(&w, &next, "printed", Duration::from_secs(20)).await;
    assert_eq!(sim.jobs().count(), 2, "never sent again: {:?}", sim.jobs().all());
    sim.shutdown().await;
    w.app.stop().await;
}

async fn paper_out_retries_with_the_reason_and_prints_once_after_refill(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults { paper_out: true, ..Faults::default() }).await;
    let id = submit(&w, "m1", "P1").await;
    let t = wait_state(&w, &id, "retrying", Duration::from_secs(20)).await;
    assert_eq!(t["last_error"], "no_paper", "{t}");
    let p = w.app.get("/v1/printers/m1", &w.key).await;
    assert_eq!(p.body["last_error"], "no_paper", "{p:?}");
    assert_eq!(sim.jobs().count(), 0);
    tokio::time::sleep(Duration::from_millis(800)).await;
    sim.faults().update_all(FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() });
    let t = wait_state(&w, &id, "printed", Duration::from_secs(20)).await;
    assert!(t["attempts"].as_i64().unwrap_or(0) >= 2, "{t}");
    assert_eq!(copies(&sim, "order P1"), 1);
    sim.shutdown().await;
    w.app.stop().await;
}

async fn a_crash_after_receiving_is_in_doubt_and_never_printed_twice(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults { crash_mid_job: 1, ..Faults::default() }).await;
    let id = submit(&w, "m1", "C1").await;
    let t = wait_state(&w, &id, "in_doubt", Duration::from_secs(30)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    // The device is asked again and again while the task waits for a person: never twice.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(copies(&sim, "order C1"), 1, "{:?}", sim.jobs().all());
    // The lane moved on.
    let next = submit(&w, "m1", "C2").await;
    wait_state(&w, &next, "printed", Duration::from_secs(20)).await;
    sim.shutdown().await;
    w.app.stop().await;
}

async fn jobs_and_results_delivered_twice_print_once(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let faults = Faults { receive_twice: 2, duplicate_result: 2, disconnect_mid_job: 1, ..Faults::default() };
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, faults).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(submit(&w, "m1", &format!("D{i}")).await);
    }
    for id in &ids {
        wait_state(&w, id, "printed", Duration::from_secs(30)).await;
    }
    for i in 0..4 {
        assert_eq!(copies(&sim, &format!("order D{i}")), 1, "{:?}", sim.jobs().all());
    }
    sim.shutdown().await;
    w.app.stop().await;
}

async fn a_lost_result_is_answered_from_the_journal(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults { lose_result: 1, ..Faults::default() }).await;
    let id = submit(&w, "m1", "L1").await;
    // No result comes; the broker sends the job again with the same key after
    // resend_after_ms, and the device answers from its journal that it printed it.
    let t = wait_state(&w, &id, "printed", Duration::from_secs(20)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    assert_eq!(copies(&sim, "order L1"), 1);
    sim.shutdown().await;
    w.app.stop().await;
}

async fn the_mqtt_server_killed_mid_stream_loses_nothing_and_prints_nothing_twice(backend: Backend) {
    let Some(mut w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults { slow_ms: 30, ..Faults::default() }).await;
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(submit(&w, "m1", &format!("K{i}")).await);
    }
    wait_until(Duration::from_secs(30), "a few printed", || async { sim.jobs().count() >= 5 }).await;
    w.mosquitto.kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    w.mosquitto.start().await;
    for id in &ids {
        wait_state(&w, id, "printed", Duration::from_secs(60)).await;
    }
    for i in 0..30 {
        assert_eq!(copies(&sim, &format!("order K{i}\n")), 1, "K{i}: {:?}", sim.jobs().all());
    }
    sim.shutdown().await;
    w.app.stop().await;
}

async fn the_broker_restarted_mid_stream_prints_nothing_twice(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults { slow_ms: 30, ..Faults::default() }).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&w, "m1", &format!("B{i}")).await);
    }
    wait_until(Duration::from_secs(30), "a few printed", || async { sim.jobs().count() >= 4 }).await;
    let World { app, mosquitto, key, _dir } = w;
    // A new broker process on the same database, knowing only what the database holds.
    let config = fast(mosquitto.port, _dir.path());
    let app = app.restart(config).await;
    let w = World { app, mosquitto, key, _dir };
    for id in &ids {
        wait_state(&w, id, "printed", Duration::from_secs(60)).await;
    }
    for i in 0..20 {
        assert_eq!(copies(&sim, &format!("order B{i}\n")), 1, "B{i}: {:?}", sim.jobs().all());
    }
    sim.shutdown().await;
    w.app.stop().await;
}

async fn devices_are_isolated_and_a_result_for_another_printer_is_refused(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let a = w
        .app
        .post(
            "/v1/webhooks",
            &w.key,
            json!({"id": "sec", "url": "http://127.0.0.1:9/alerts", "events": ["printer.refused_message"]}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let victim_login = printer(&w, "m1", device("dev-1")).await;
    let (user2, pass2) = printer(&w, "m2", device("dev-2")).await;

    // dev-2, with its own valid login, listens on the victim's topics and everyone's.
    let mut options = rumqttc::MqttOptions::new("dev-2", "127.0.0.1", w.mosquitto.port);
    options.set_credentials(user2, pass2);
    let (spy, mut eventloop) = rumqttc::AsyncClient::new(options, 16);
    spy.subscribe("onceprint/v1/to-device/dev-1/#", rumqttc::QoS::AtLeastOnce).await.expect("subscribe");
    spy.subscribe("onceprint/v1/to-device/#", rumqttc::QoS::AtLeastOnce).await.expect("subscribe");
    let overheard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (heard, puback) = (overheard.clone(), acked.clone());
    let listener = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    heard.lock().expect("lock").push(p.topic.clone());
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => {
                    puback.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });

    // The victim prints a job whose result is lost, then is switched off: its task stays in
    // flight.
    let victim =
        sim(&w, Protocol::Onceprint, "dev-1", victim_login, Faults { lose_result: 1, ..Faults::default() }).await;
    let id = submit(&w, "m1", "V1").await;
    wait_until(Duration::from_secs(20), "the victim printed", || async { victim.jobs().count() == 1 }).await;
    victim.shutdown().await;
    wait_state(&w, &id, "sent", Duration::from_secs(5)).await;

    let forged = json!({"v": 1, "task_id": id, "attempt": 1, "key": "V1#m1", "result": "printed"}).to_string();
    // On the victim's topic: the MQTT server drops it (dev-2 may not publish there).
    spy.publish("onceprint/v1/to-server/dev-1/result", rumqttc::QoS::AtLeastOnce, false, forged.clone())
        .await
        .expect("publish");
    // On its own topic the server lets it through; onceprint refuses it.
    spy.publish("onceprint/v1/to-server/dev-2/result", rumqttc::QoS::AtLeastOnce, false, forged)
        .await
        .expect("publish");
    wait_until(Duration::from_secs(10), "both forged results reached the MQTT server", || async {
        acked.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    wait_until(Duration::from_secs(10), "the refusal is audited", || async {
        let d = w.app.get("/v1/webhooks/sec/deliveries", &w.key).await;
        d.body.to_string().contains("printer.refused_message")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = task(&w, &id).await;
    assert_eq!(t["state"], "sent", "neither forged result moved the task: {t}");
    let heard = overheard.lock().expect("lock").clone();
    assert!(heard.is_empty(), "the ACL keeps dev-1's jobs from dev-2: {heard:?}");
    listener.abort();
    w.app.stop().await;
}

async fn a_result_is_acknowledged_only_once_it_is_durable(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:00:00:01";
    let login = printer(&w, "star", star(mac)).await;
    // A Star printer, so that a result lost by the broker cannot be made good: sent the
    // token again, the printer would only answer "duplicate", and the task would end in
    // doubt instead of printed.
    let sim = sim(&w, Protocol::Cloudprnt, mac, login, Faults { slow_ms: 1_500, ..Faults::default() }).await;
    let id = submit(&w, "star", "R1").await;
    wait_state(&w, &id, "sent", Duration::from_secs(20)).await;
    wait_until(Duration::from_secs(20), "the printer fetched its url job", || async {
        let events = w.app.get(&format!("/v1/print-tasks/{id}/events"), &w.key).await;
        events.body.to_string().contains("fetched by the printer over HTTP")
    })
    .await;
    // The database refuses every change of a task while the result arrives…
    w.app.sql("ALTER TABLE task_events RENAME TO task_events_away").await;
    wait_until(Duration::from_secs(20), "the printer printed", || async { sim.jobs().count() == 1 }).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    // …and the broker stops before it could apply it. Unacknowledged, the result stays with
    // the MQTT server for the broker's next process.
    let World { app, mosquitto, key, _dir } = w;
    let config = fast(mosquitto.port, _dir.path());
    let app = app.restart(config).await;
    let w = World { app, mosquitto, key, _dir };
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.app.sql("ALTER TABLE task_events_away RENAME TO task_events").await;
    let t = wait_state(&w, &id, "printed", Duration::from_secs(20)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    assert_eq!(sim.jobs().count(), 1);
    sim.shutdown().await;
    w.app.stop().await;
}

/// Star CloudPRNT Protocol Guide, "Server setting information request (GET)": a Star
/// printer is set up with the server URL and its login only, and asks for
/// `cloudprnt-setting.json` beside that URL before anything else. An `mqtt` printer of
/// Star's protocol is told the MQTT server and its login; a `cloudprnt` printer to poll.
async fn a_star_printer_learns_the_mqtt_server_and_its_login_from_its_server_settings(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:aa:bb:01";
    let (user, pass) = printer(&w, "star", star(mac)).await;
    let (http_user, http_pass) = {
        let transport = json!({"kind": "cloudprnt", "mac": "00:11:62:aa:bb:02"});
        let a =
            w.app.post("/v1/printers", &w.key, json!({"id": "polls", "store_id": "s1", "transport": transport})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        let c = &a.body["credentials"];
        (c["username"].as_str().expect("username").to_owned(), c["password"].as_str().expect("password").to_owned())
    };
    let (dev_user, dev_pass) = printer(&w, "dev", device("dev-1")).await;
    let http = reqwest::Client::new();
    let url = format!("{}/cloudprnt-setting.json", w.app.base);
    let get = |user: String, pass: String, mac: &'static str| {
        let req = http.get(&url).basic_auth(user, Some(pass)).query(&[("mac", mac), ("replaced_path", "cloudprnt")]);
        async move {
            let res = req.send().await.expect("settings GET");
            let status = res.status();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = get(user.clone(), pass.clone(), "00:11:62:AA:BB:01").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["title"], "star_cloudprnt_server_setting", "{body}");
    assert_eq!(body["serverSupportProtocol"], json!(["HTTP", "MQTT"]), "{body}");
    let mqtt = &body["settingForMQTT"];
    assert_eq!(mqtt["useTriggerPOST"], false, "Full MQTT: {body}");
    let conn = &mqtt["mqttConnectionSetting"];
    assert_eq!(
        (conn["hostName"].as_str(), conn["portNumber"].as_u64()),
        (Some("127.0.0.1"), Some(w.mosquitto.port as u64))
    );
    assert_eq!(conn["useTls"], false);
    let auth = &conn["authenticationSetting"];
    assert_eq!((auth["username"].as_str(), auth["password"].as_str()), (Some(user.as_str()), Some(pass.as_str())));
    // That login is what the MQTT server takes from this printer (its password file, which
    // the broker rewrites shortly after the printer's creation).
    let start = Instant::now();
    loop {
        let (probe, mut events) = {
            let mut o = rumqttc::MqttOptions::new(mac, "127.0.0.1", w.mosquitto.port);
            o.set_credentials(user.clone(), pass.clone());
            rumqttc::AsyncClient::new(o, 10)
        };
        let connack = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(c))) => return Ok(c.code),
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .await
        .expect("an answer from the MQTT server");
        let _ = probe.disconnect().await;
        if connack == Ok(rumqttc::ConnectReturnCode::Success) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the MQTT server refuses the login it was told: {connack:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A printer that polls is told so; other logins and MACs are refused.
    let (status, body) = get(http_user, http_pass, "00:11:62:aa:bb:02").await;
    assert_eq!((status, &body["serverSupportProtocol"]), (StatusCode::OK, &json!(["HTTP"])), "{body}");
    assert!(body.get("settingForMQTT").is_none(), "{body}");
    for (u, p, m) in [
        (user.clone(), "wrong".to_owned(), "00:11:62:aa:bb:01"),
        (user.clone(), pass.clone(), "00:11:62:aa:bb:02"),
        (dev_user, dev_pass, "00:11:62:aa:bb:01"),
    ] {
        let (status, body) = get(u, p, m).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    w.app.stop().await;
}

/// A Star printer in CloudPRNT Version MQTT takes `url` print-jobs and GETs each from
/// `/cloudprnt` with its own login (Star's "Print job requests (GET)", "For CloudPRNT
/// Version MQTT (Full MQTT / Pass URL)"): the job is the print area at the width the
/// printer reports, the fetch is in the task's trail, and the job prints once.
async fn a_star_printer_in_mqtt_mode_fetches_its_url_jobs_and_prints_each_once(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:aa:bb:cc";
    let login = printer(&w, "star", star(mac)).await;
    let sim = sim(&w, Protocol::Cloudprnt, mac, login, Faults::default()).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(submit(&w, "star", &format!("U{i}")).await);
    }
    for id in &ids {
        let t = wait_state(&w, id, "printed", Duration::from_secs(30)).await;
        assert_eq!(t["attempts"], 1, "{t}");
        let events = w.app.get(&format!("/v1/print-tasks/{id}/events"), &w.key).await;
        assert!(events.body.to_string().contains("fetched by the printer over HTTP as image/png"), "{}", events.body);
    }
    assert_eq!(sim.jobs().count(), 3, "each printed once: {:?}", sim.jobs().all());
    // The job GET names the printer's own jobs only: a token of no job of its is 404.
    let p = w.app.get("/v1/printers/star", &w.key).await;
    assert_eq!(p.body["online"], true, "{p:?}");
    sim.shutdown().await;
    w.app.stop().await;
}

/// A Star printer that reports "410 Out of paper" (client-status) prints nothing: each
/// attempt it answers with 410 before fetching ends with nothing printed and the ticket
/// waits for the next, and it prints once after the roll is changed. A result that
/// arrives twice changes nothing more.
async fn a_star_printer_out_of_paper_waits_and_prints_once_after_refill(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let mac = "00:11:62:aa:bb:cd";
    let login = printer(&w, "star", star(mac)).await;
    let faults = Faults { paper_out: true, duplicate_result: 1, ..Faults::default() };
    let sim = sim(&w, Protocol::Cloudprnt, mac, login, faults).await;
    wait_until(Duration::from_secs(20), "the printer reports no paper", || async {
        w.app.get("/v1/printers/star", &w.key).await.body["last_error"] == "no_paper"
    })
    .await;
    let id = submit(&w, "star", "P1").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Each attempt ends at once with the printer's 410 (nothing fetched, nothing printed):
    // the ticket goes round pending, sent and retrying, never to a person.
    let t = task(&w, &id).await;
    assert!(["pending", "sent", "retrying"].contains(&t["state"].as_str().unwrap_or_default()), "{t}");
    assert_eq!(sim.jobs().count(), 0);
    sim.faults().update_all(FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() });
    wait_state(&w, &id, "printed", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(task(&w, &id).await["state"], "printed");
    assert_eq!(sim.jobs().count(), 1, "printed once: {:?}", sim.jobs().all());
    sim.shutdown().await;
    w.app.stop().await;
}

/// Devices of both protocols, one per store, run in one process (one shared paper log)
/// and left idle: each ticket goes out on its commit (the broker never sweeps every store
/// in these tests), to its own device only, and prints once; a second round on the same
/// devices too.
async fn idle_devices_in_many_stores_each_get_their_own_ticket_once(backend: Backend) {
    let Some(w) = world(backend).await else { return };
    let paper = w._dir.path().join("fleet-paper.jsonl");
    let shared = Shared::open(Some(&paper)).await.expect("paper log");
    let mut fleet = Vec::new();
    for i in 0..12 {
        let store = format!("shop{i}");
        let a = w.app.post("/v1/stores", &w.key, json!({"id": store, "name": format!("Shop {i}")})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        // Every third a Star printer, the others onceprint devices.
        let star_printer = i % 3 == 2;
        let name = if star_printer { format!("00:11:62:10:00:{i:02x}") } else { format!("fleet-{i}") };
        let transport = if star_printer { star(&name) } else { device(&name) };
        let id = format!("f{i}");
        let a = w.app.post("/v1/printers", &w.key, json!({"id": id, "store_id": store, "transport": transport})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        let c = &a.body["credentials"];
        let (user, pass) = (c["username"].as_str().expect("username"), c["password"].as_str().expect("password"));
        let config = if star_printer {
            MqttSimConfig::cloudprnt(&format!("{}/cloudprnt", w.app.base), &name, user, pass)
        } else {
            MqttSimConfig::onceprint("127.0.0.1", w.mosquitto.port, &name, user, pass)
        };
        fleet.push((id, name, MqttPrinter::start_shared(config, &shared).await.expect("device")));
    }
    wait_until(Duration::from_secs(30), "every device online", || async {
        let p = w.app.get("/v1/printers", &w.key).await;
        p.body["printers"].as_array().is_some_and(|a| a.iter().filter(|p| p["online"] == true).count() == 12)
    })
    .await;
    for round in 0..2 {
        let mut ids = Vec::new();
        for (id, _, _) in &fleet {
            ids.push(submit(&w, id, &format!("R{round}-{id}")).await);
        }
        for id in &ids {
            let t = wait_state(&w, id, "printed", Duration::from_secs(30)).await;
            assert_eq!(t["attempts"], 1, "{t}");
        }
    }
    let jobs = shared.jobs().all();
    assert_eq!(jobs.len(), 24, "{jobs:?}");
    for (id, name, _) in &fleet {
        let on_it = jobs.iter().filter(|j| j.device.as_deref() == Some(name.as_str())).count();
        assert_eq!(on_it, 2, "{id}: {jobs:?}");
        if name.starts_with("00:11:62") {
            // A Star printer prints the picture of its ticket (`png:` and a hash).
            continue;
        }
        for round in 0..2 {
            let mine: Vec<_> = jobs.iter().filter(|j| j.text.contains(&format!("order R{round}-{id}\n"))).collect();
            assert_eq!(mine.len(), 1, "{id} round {round}: {jobs:?}");
            assert_eq!(mine[0].device.as_deref(), Some(name.as_str()), "{id}'s ticket on another device: {jobs:?}");
        }
    }
    // The paper log holds what the devices printed, one line each.
    let lines = std::fs::read_to_string(&paper).expect("paper log");
    assert_eq!(lines.lines().count(), 24, "{lines}");
    for (_, _, d) in fleet {
        d.shutdown().await;
    }
    w.app.stop().await;
}

/// Tickets committed while the MQTT server is down cannot go out (no device can be
/// reached); once it is back they go out without any further commit or result, each
/// printed once.
async fn tickets_committed_while_the_mqtt_server_is_down_go_out_once_it_is_back(backend: Backend) {
    let Some(mut w) = world(backend).await else { return };
    let login = printer(&w, "m1", device("dev-1")).await;
    let sim = sim(&w, Protocol::Onceprint, "dev-1", login, Faults::default()).await;
    let first = submit(&w, "m1", "W0").await;
    wait_state(&w, &first, "printed", Duration::from_secs(20)).await;
    w.mosquitto.kill();
    let mut ids = Vec::new();
    for i in 1..4 {
        ids.push(submit(&w, "m1", &format!("W{i}")).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.mosquitto.start().await;
    for id in &ids {
        wait_state(&w, id, "printed", Duration::from_secs(30)).await;
    }
    for i in 0..4 {
        assert_eq!(copies(&sim, &format!("order W{i}\n")), 1, "W{i}: {:?}", sim.jobs().all());
    }
    sim.shutdown().await;
    w.app.stop().await;
}
