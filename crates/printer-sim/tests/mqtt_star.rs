//! The Star CloudPRNT Version MQTT printer against a stub CloudPRNT server (a small HTTP
//! server answering the settings request and serving jobs) and a real Mosquitto of the
//! test's own: what the printer asks over HTTP, what it publishes over MQTT, and what it
//! puts on paper.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use onceprint_printer_sim::mqtt::{encode_status, MqttPrinter, MqttSimConfig, DUPLICATE_STATUS};
use onceprint_printer_sim::{Cut, FaultUpdate};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const MAC: &str = "00:11:62:aa:bb:cc";
const HTTP_USER: &str = "star-printer";
const HTTP_PASSWORD: &str = "http-secret";
const MQTT_USER: &str = "printer-mqtt";
const MQTT_PASSWORD: &str = "mqtt-secret";
const SERVER_USER: &str = "server-mqtt";
const SERVER_PASSWORD: &str = "server-secret";

fn mosquitto_exe() -> Option<PathBuf> {
    ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// A Mosquitto on a free loopback port that takes only the two logins of the test.
struct Mosquitto {
    port: u16,
    child: Child,
}

impl Mosquitto {
    async fn start(dir: &Path) -> Mosquitto {
        let exe = mosquitto_exe().expect("mosquitto is installed (.ci/run installs it)");
        let passwd = dir.join("passwd");
        std::fs::write(&passwd, "").expect("password file");
        for (user, password) in [(MQTT_USER, MQTT_PASSWORD), (SERVER_USER, SERVER_PASSWORD)] {
            let ok = Command::new("mosquitto_passwd")
                .arg("-b")
                .arg(&passwd)
                .args([user, password])
                .status()
                .expect("mosquitto_passwd");
            assert!(ok.success(), "mosquitto_passwd failed");
        }
        let port = free_port();
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                // `user root`: when started as root Mosquitto would switch to its own user,
                // which cannot read the test's private temporary directory.
                "user root\nlistener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\npersistence false\n\
                 log_dest stderr\nlog_type error\n",
                passwd.display()
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
        wait_until(Duration::from_secs(10), "mosquitto listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        Mosquitto { port, child }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One request the stub server received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    query: HashMap<String, String>,
    headers: HeaderMap,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A job the stub serves at `/job` for one token: status, content type, `X-Star-Cut`, body.
#[derive(Clone)]
struct Served {
    status: StatusCode,
    content_type: &'static str,
    cut: Option<&'static str>,
    body: Vec<u8>,
}

#[derive(Clone, Default)]
struct Stub {
    /// The settings answer; `None` answers 404 (a server of CloudPRNT Version HTTP only).
    settings: Arc<Mutex<Option<Value>>>,
    jobs: Arc<Mutex<HashMap<String, Served>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Stub {
    fn seen(&self, path: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.path == path).cloned().collect()
    }

    fn serve(&self, token: &str, served: Served) {
        self.jobs.lock().unwrap().insert(token.to_owned(), served);
    }
}

fn record(stub: &Stub, req: &Request) -> Seen {
    let query = req.uri().query().map(|q| url_pairs(q).into_iter().collect::<HashMap<_, _>>()).unwrap_or_default();
    let seen = Seen { path: req.uri().path().to_owned(), query, headers: req.headers().clone() };
    stub.seen.lock().unwrap().push(seen.clone());
    seen
}

fn url_pairs(q: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://x/?{q}")).unwrap().query_pairs().into_owned().collect()
}

async fn settings(State(stub): State<Stub>, req: Request) -> Response {
    record(&stub, &req);
    match stub.settings.lock().unwrap().clone() {
        Some(v) => axum::Json(v).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn job(State(stub): State<Stub>, req: Request) -> Response {
    let seen = record(&stub, &req);
    let token = seen.query.get("token").cloned().unwrap_or_default();
    let Some(served) = stub.jobs.lock().unwrap().get(&token).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut res = (served.status, served.body).into_response();
    res.headers_mut().insert("content-type", served.content_type.parse().unwrap());
    if let Some(cut) = served.cut {
        res.headers_mut().insert("x-star-cut", cut.parse().unwrap());
    }
    res
}

async fn start_stub() -> (Stub, u16) {
    let stub = Stub::default();
    let app = Router::new()
        .route("/cloudprnt-setting.json", get(settings))
        .route("/some/path/cloudprnt-setting.json", get(settings))
        .route("/job", get(job))
        .with_state(stub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (stub, port)
}

/// Star's sample settings file for MQTT (`cloudprnt-setting_mqtt.json`) with the test's
/// Mosquitto and the printer's MQTT login.
fn mqtt_settings(port: u16) -> Value {
    json!({
        "title": "star_cloudprnt_server_setting",
        "version": "1.0.0",
        "serverSupportProtocol": ["HTTP", "MQTT"],
        "settingForMQTT": {
            "useTriggerPOST": false,
            "mqttConnectionSetting": {
                "hostName": "127.0.0.1",
                "portNumber": port,
                "useTls": false,
                "authenticationSetting": {"username": MQTT_USER, "password": MQTT_PASSWORD}
            }
        }
    })
}

fn png(width: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, 4);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().unwrap();
        w.write_image_data(&vec![255u8; width as usize * 4]).unwrap();
    }
    out
}

/// The CloudPRNT server's side of the MQTT server: it publishes to the printer and hears
/// everything the printer publishes.
struct Server {
    client: AsyncClient,
    heard: mpsc::UnboundedReceiver<(String, Value)>,
}

impl Server {
    async fn connect(port: u16) -> Server {
        let mut options = MqttOptions::new("cloudprnt-server", "127.0.0.1", port);
        options.set_credentials(SERVER_USER, SERVER_PASSWORD);
        options.set_keep_alive(Duration::from_secs(5));
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (tx, heard) = mpsc::unbounded_channel();
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let mut subscribed_tx = Some(subscribed_tx);
        client.subscribe("star/cloudprnt/to-server/#", QoS::AtLeastOnce).await.unwrap();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(t) = subscribed_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let v = serde_json::from_slice(&p.payload).unwrap_or(Value::Null);
                        if tx.send((p.topic.clone(), v)).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), subscribed).await.expect("subscribed").unwrap();
        Server { client, heard }
    }

    async fn publish(&self, method: &str, payload: Value) {
        let topic = format!("star/cloudprnt/to-device/{MAC}/{method}");
        self.client.publish(topic, QoS::AtLeastOnce, false, payload.to_string()).await.unwrap();
    }

    /// The next message on `…/{method}` from the printer (others are skipped).
    async fn next(&mut self, method: &str) -> Value {
        let want = format!("star/cloudprnt/to-server/{MAC}/{method}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (topic, v) = tokio::time::timeout(left, self.heard.recv())
                .await
                .unwrap_or_else(|_| panic!("no {method} within 10 s"))
                .expect("server connection");
            if topic == want {
                return v;
            }
        }
    }

    /// Publishes a print-job and returns its print-result.
    async fn job(&mut self, payload: Value) -> Value {
        let token = payload["jobToken"].clone();
        self.publish("print-job", payload).await;
        let result = self.next("print-result").await;
        assert_eq!(result["jobToken"], token, "{result}");
        result
    }
}

fn url_job(token: &str, media: &[&str], port: u16) -> Value {
    json!({"title": "print-job", "jobToken": token, "jobType": "url", "mediaTypes": media,
           "printData": format!("http://127.0.0.1:{port}/job")})
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

#[tokio::test]
async fn a_star_mqtt_printer_does_what_stars_documents_say() {
    let dir = tempfile::tempdir().unwrap();
    let mosquitto = Mosquitto::start(dir.path()).await;
    let (stub, http_port) = start_stub().await;
    let config = MqttSimConfig {
        paper_log: Some(dir.path().join("paper.jsonl")),
        ..MqttSimConfig::cloudprnt(&format!("http://127.0.0.1:{http_port}/cloudprnt"), MAC, HTTP_USER, HTTP_PASSWORD)
    };
    let printer = MqttPrinter::start(config).await.expect("printer");
    assert_eq!(printer.name(), format!("cloudprnt-mqtt:{MAC}"));

    // A server of CloudPRNT Version HTTP only answers 404: an MQTT printer reports it and
    // asks again later.
    wait_until(Duration::from_secs(10), "the printer reports the HTTP-only server", || {
        printer.last_error().is_some_and(|e| e.contains("404"))
    })
    .await;
    let asked = stub.seen("/cloudprnt-setting.json");
    let first = &asked[0];
    assert_eq!(first.query.get("mac").map(String::as_str), Some(MAC));
    assert_eq!(first.query.get("replaced_path").map(String::as_str), Some("cloudprnt"));
    assert_eq!(first.query.len(), 2, "no uid: the server never set one: {:?}", first.query);
    assert_eq!(first.header("authorization"), Some(basic(HTTP_USER, HTTP_PASSWORD).as_str()));
    wait_until(Duration::from_secs(10), "it asks again", || stub.seen("/cloudprnt-setting.json").len() >= 2).await;

    // With MQTT in the settings it connects with the login given there and says its status.
    let mut server = Server::connect(mosquitto.port).await;
    *stub.settings.lock().unwrap() = Some(mqtt_settings(mosquitto.port));
    let status = server.next("client-status").await;
    assert_eq!(status["title"], "client-status");
    assert_eq!(status["printerMAC"], MAC);
    assert_eq!(status["statusCode"], "200%20OK");
    assert_eq!(printer.last_error(), None);

    // A url job: a PNG of exactly 576 dots, downloaded with the printer's HTTP login.
    let image = png(576);
    stub.serve(
        "t1",
        Served { status: StatusCode::OK, content_type: "image/png", cut: Some("partial"), body: image.clone() },
    );
    let result = server.job(url_job("t1", &["image/png"], http_port)).await;
    assert_eq!(
        result,
        json!({"title": "print-result", "jobToken": "t1", "printSucceeded": true, "statusCode": "200%20OK",
               "printerMAC": MAC})
    );
    let gets = stub.seen("/job");
    assert_eq!(gets.len(), 1);
    let get = &gets[0];
    let q = |k: &str| get.query.get(k).map(String::as_str);
    assert_eq!((q("mac"), q("type"), q("token")), (Some(MAC), Some("image/png"), Some("t1")));
    assert_eq!(get.header("authorization"), Some(basic(HTTP_USER, HTTP_PASSWORD).as_str()));
    assert_eq!(get.header("x-star-print-width"), Some("72"));
    assert_eq!(get.header("x-star-horizontal-resolution"), Some("8"));
    let printed = printer.jobs().all();
    assert_eq!(printed.len(), 1);
    assert_eq!((printed[0].images, printed[0].cut, printed[0].bytes), (1, Cut::Partial, image.len()));
    assert!(printed[0].text.starts_with("png:"), "{:?}", printed[0]);
    assert_eq!((printed[0].job.as_deref(), printed[0].device.as_deref()), (Some("t1"), Some(MAC)));
    assert_eq!(printed[0].printer, printer.name());
    let log = std::fs::read_to_string(dir.path().join("paper.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");

    // It picks a media type it takes from those offered, and prints text as text.
    stub.serve(
        "t2",
        Served { status: StatusCode::OK, content_type: "text/plain", cut: None, body: b"Table 5\n".to_vec() },
    );
    let result = server.job(url_job("t2", &["application/vnd.star.starprnt", "text/plain"], http_port)).await;
    assert_eq!(result["printSucceeded"], true, "{result}");
    assert_eq!(stub.seen("/job")[1].query.get("type").map(String::as_str), Some("text/plain"));
    let last = printer.jobs().all().pop().unwrap();
    assert_eq!((last.text.as_str(), last.cut, last.images), ("Table 5\n", Cut::Full, 0));

    // A repeated token: "duplicate, not printed", and nothing is downloaded or printed.
    let result = server.job(url_job("t1", &["image/png"], http_port)).await;
    assert_eq!(result["printSucceeded"], false, "{result}");
    assert_eq!(result["statusCode"], encode_status(DUPLICATE_STATUS));
    assert_eq!((stub.seen("/job").len(), printer.jobs().count()), (2, 2));

    // A raw PNG is not something a Star printer takes in raw mode: 510, nothing printed.
    let raw_png = json!({"title": "print-job", "jobToken": "t3", "jobType": "raw", "mediaTypes": ["image/png"],
                         "printData": base64::engine::general_purpose::STANDARD.encode(&image)});
    let result = server.job(raw_png).await;
    assert_eq!(result["printSucceeded"], false, "{result}");
    assert!(result["statusCode"].as_str().unwrap().starts_with("510"), "{result}");
    assert_eq!(printer.jobs().count(), 2);

    // Raw text, as Star's sample server sends it, prints as it is.
    let raw_text = json!({"title": "print-job", "jobToken": "t4", "jobType": "raw", "mediaTypes": ["text/plain"],
                          "printData": "Raw receipt\n",
                          "printerControl": {"cutter": {"type": "partial", "feed": true}}});
    let result = server.job(raw_text).await;
    assert_eq!(result["printSucceeded"], true, "{result}");
    let last = printer.jobs().all().pop().unwrap();
    assert_eq!((last.text.as_str(), last.cut), ("Raw receipt\n", Cut::Partial));

    // What the download can go wrong with, each refused with Star's code, nothing printed.
    let cases: [(&str, Served, &str); 4] = [
        ("t5", Served { status: StatusCode::OK, content_type: "image/png", cut: None, body: png(384) }, "511"),
        (
            "t6",
            Served { status: StatusCode::OK, content_type: "image/png", cut: None, body: b"not a png".to_vec() },
            "511",
        ),
        (
            "t7",
            Served {
                status: StatusCode::OK,
                content_type: "text/plain; charset=utf-8",
                cut: None,
                body: b"x".to_vec(),
            },
            "510",
        ),
        (
            "t8",
            Served { status: StatusCode::NOT_FOUND, content_type: "text/plain", cut: None, body: Vec::new() },
            "520",
        ),
    ];
    for (token, served, code) in cases {
        let media = served.content_type.split(';').next().unwrap().to_owned();
        stub.serve(token, served);
        let result = server.job(url_job(token, &[&media], http_port)).await;
        assert_eq!(result["printSucceeded"], false, "{token}: {result}");
        assert!(result["statusCode"].as_str().unwrap().starts_with(code), "{token}: {result}");
    }
    // No media type it takes: 510 without a download.
    let before = stub.seen("/job").len();
    let result = server.job(url_job("t9", &["application/vnd.star.starprnt"], http_port)).await;
    assert!(result["statusCode"].as_str().unwrap().starts_with("510"), "{result}");
    assert_eq!(stub.seen("/job").len(), before);
    assert_eq!(printer.jobs().count(), 3, "{:?}", printer.jobs().all());

    // It answers request-client-status, and says so by itself when its status changes.
    server.publish("request-client-status", json!({"title": "request-client-status"})).await;
    assert_eq!(server.next("client-status").await["statusCode"], "200%20OK");
    printer.faults().update_all(FaultUpdate { paper_out: Some(true), ..FaultUpdate::default() });
    assert_eq!(server.next("client-status").await["statusCode"], "410%20Out%20of%20paper");
    let result = server.job(url_job("t10", &["text/plain"], http_port)).await;
    assert_eq!(
        (result["printSucceeded"].clone(), result["statusCode"].clone()),
        (json!(false), json!("410%20Out%20of%20paper"))
    );

    // request-get-server-info: settings naming another login take effect at once; it
    // leaves with a DISCONNECT (no will) and comes back with the new login.
    let asked = stub.seen("/cloudprnt-setting.json").len();
    let mut moved = mqtt_settings(mosquitto.port);
    moved["settingForMQTT"]["mqttConnectionSetting"]["authenticationSetting"] =
        json!({"username": SERVER_USER, "password": SERVER_PASSWORD});
    *stub.settings.lock().unwrap() = Some(moved);
    server.publish("request-get-server-info", json!({"title": "request-get-server-info"})).await;
    assert_eq!(server.next("client-status").await["statusCode"], "410%20Out%20of%20paper");
    assert!(stub.seen("/cloudprnt-setting.json").len() > asked);
    while let Ok((topic, _)) = server.heard.try_recv() {
        assert!(!topic.ends_with("/client-will"), "a planned reconnection is not a lost printer");
    }

    // Its will announces it gone when it stops without a goodbye.
    printer.shutdown().await;
    let will = server.next("client-will").await;
    assert_eq!(will, json!({"title": "client-will", "printerMAC": MAC}));
}

#[tokio::test]
async fn settings_a_star_printer_cannot_use_are_errors() {
    let (stub, http_port) = start_stub().await;
    let url = format!("http://127.0.0.1:{http_port}/some/path/printer.php");
    let printer = MqttPrinter::start(MqttSimConfig::cloudprnt(&url, MAC, HTTP_USER, HTTP_PASSWORD)).await.unwrap();
    let mut trigger = mqtt_settings(1883);
    trigger["settingForMQTT"]["useTriggerPOST"] = json!(true);
    *stub.settings.lock().unwrap() = Some(trigger);
    wait_until(Duration::from_secs(10), "Trigger POST is refused", || {
        printer.last_error().is_some_and(|e| e.contains("Trigger POST"))
    })
    .await;
    let seen = stub.seen("/some/path/cloudprnt-setting.json");
    assert_eq!(seen[0].query.get("replaced_path").map(String::as_str), Some("printer.php"));
    let mut http_only = mqtt_settings(1883);
    http_only["serverSupportProtocol"] = json!(["HTTP"]);
    *stub.settings.lock().unwrap() = Some(http_only);
    wait_until(Duration::from_secs(10), "an HTTP-only answer is refused", || {
        printer.last_error().is_some_and(|e| e.contains("not MQTT"))
    })
    .await;
    // Settings it can use, naming an MQTT server that does not answer.
    let nobody = free_port();
    *stub.settings.lock().unwrap() = Some(mqtt_settings(nobody));
    wait_until(Duration::from_secs(10), "the silent MQTT server is reported", || {
        printer.last_error().is_some_and(|e| e.contains(&format!("MQTT server 127.0.0.1:{nobody}")))
    })
    .await;
    printer.shutdown().await;
}
