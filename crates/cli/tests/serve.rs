//! `transformer serve` end to end: a small run trained here, served by the real binary on a
//! free port, driven over real TCP connections: LibreTranslate's API answering exactly what
//! `mt translate` prints, HTML kept, batching across requests that changes no answer, the
//! native endpoint, API keys, every kind of bad input leaving the server up, a full queue,
//! SIGTERM; the real `libretranslatepy` client and a Mastodon-shaped request
//! (`scripts/serve_clients.py`); the web page in headless Chromium.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::{bin, chromium, repo_root, write_tiny_config, write_toy_corpus, GERMAN};

/// A small German -> English run, trained once for every test of this file.
fn run_dir() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("serve-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        write_toy_corpus(&dir, &GERMAN, &[("train", 300), ("valid", 20)]);
        write_tiny_config(
            &dir,
            false,
            false,
            "lr_factor = 0.7\nepochs = 30\nmax_tokens = 160\nlog_interval = 20\nbeam = 3\n",
        );
        let out = dir.join("run");
        let status = bin()
            .args(["mt", "train", "--config"])
            .arg(dir.join("config.toml"))
            .arg("--out")
            .arg(&out)
            .args(["--src-lang", "de", "--tgt-lang", "en"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the test run trains");
        out
    })
}

/// What `mt translate` prints for these lines.
fn mt_translate(lines: &[&str]) -> Vec<String> {
    mt_translate_with(lines, &[])
}

/// What `mt translate` with these extra flags prints for these lines.
fn mt_translate_with(lines: &[&str], flags: &[&str]) -> Vec<String> {
    translate_run(run_dir(), lines, flags).0
}

/// `mt translate --run RUN` with `flags` on these lines: its output lines and its stderr;
/// it must succeed.
fn translate_run(run: &Path, lines: &[&str], flags: &[&str]) -> (Vec<String>, String) {
    let mut child = bin()
        .args(["mt", "translate", "--run"])
        .arg(run)
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all((lines.join("\n") + "\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (lines, stderr)
}

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let log = run_dir().with_file_name(format!("server-{n}.log"));
        let mut cmd = bin();
        cmd.arg("serve");
        if !extra.contains(&"--run") {
            cmd.arg("--run").arg(run_dir());
        }
        let mut child = cmd
            .args(["--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no address printed: {line:?}"));
        Server { child, port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// Sends raw bytes as one request and returns (status, headers, body).
    fn raw(&self, request: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = self.connect();
        // A server may answer (413) and close before reading all of a large body.
        let _ = s.write_all(request);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let split = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&buf)));
        let head = String::from_utf8_lossy(&buf[..split]).to_string();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, buf[split + 4..].to_vec())
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        ctype: &str,
        body: &[u8],
    ) -> (u16, String, Vec<u8>) {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !ctype.is_empty() {
            req.push_str(&format!("Content-Type: {ctype}\r\n"));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.raw(&bytes)
    }

    fn json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, b) = self.request(
            "POST",
            path,
            "application/json",
            body.to_string().as_bytes(),
        );
        (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> (u16, String, Value) {
        let (status, head, b) = self.request("GET", path, "", b"");
        (
            status,
            head,
            serde_json::from_slice(&b).unwrap_or(Value::Null),
        )
    }

    fn stop(mut self) -> (std::process::ExitStatus, String) {
        unsafe {
            libc_kill(self.child.id() as i32, 15);
        }
        let status = self.child.wait().unwrap();
        let log = self.log();
        (status, log)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

const LINES: [&str; 6] = [
    "ein hund läuft schnell .",
    "zwei katzen schlafen im haus .",
    "ein haus .",
    "katzen schlafen .",
    "zwei hund läuft im haus schnell .",
    "im haus schlafen zwei katzen .",
];

#[test]
fn libretranslate_api_answers_what_mt_translate_prints() {
    let want = mt_translate(&LINES);
    let s = Server::start(&[]);
    // One string, as JSON.
    let (st, v) = s.json(
        "/translate",
        &json!({"q": LINES[0], "source": "de", "target": "en"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["translatedText"], want[0]);
    // A list, in order.
    let (st, v) = s.json(
        "/translate",
        &json!({"q": LINES, "source": "de", "target": "en", "format": "text"}),
    );
    assert_eq!(st, 200);
    assert_eq!(v["translatedText"], json!(want));
    // Lines of one text are translated line by line.
    let (_, v) = s.json(
        "/translate",
        &json!({"q": format!("{}\n{}", LINES[1], LINES[2]), "source": "de", "target": "en"}),
    );
    assert_eq!(v["translatedText"], format!("{}\n{}", want[1], want[2]));
    // A url-encoded form, as libretranslatepy posts it.
    let form: String = form_urlencoded(&[("q", LINES[3]), ("source", "de"), ("target", "en")]);
    let (st, _, b) = s.request(
        "POST",
        "/translate",
        "application/x-www-form-urlencoded",
        form.as_bytes(),
    );
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (st, v["translatedText"].as_str().unwrap()),
        (200, want[3].as_str())
    );
    // A multipart form.
    let body = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"q\"\r\n\r\n{}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"source\"\r\n\r\nde\r\n--XyZ\r\nContent-Disposition: form-data; name=\"target\"\r\n\r\nen\r\n--XyZ--\r\n",
        LINES[4]
    );
    let (st, _, b) = s.request(
        "POST",
        "/translate",
        "multipart/form-data; boundary=XyZ",
        body.as_bytes(),
    );
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (st, v["translatedText"].as_str().unwrap()),
        (200, want[4].as_str())
    );
    // Alternatives: the beam's runners-up, none equal to the translation.
    let (_, v) = s.json(
        "/translate",
        &json!({"q": LINES[5], "source": "de", "target": "en", "alternatives": 2}),
    );
    assert_eq!(v["translatedText"], want[5]);
    let alts = v["alternatives"].as_array().unwrap();
    assert!(!alts.is_empty() && alts.len() <= 2, "{v}");
    assert!(alts.iter().all(|a| a != &v["translatedText"]));
    // source=auto: the detected language with a confidence.
    let (_, v) = s.json(
        "/translate",
        &json!({"q": [LINES[0], LINES[1]], "source": "auto", "target": "en"}),
    );
    assert_eq!(v["translatedText"], json!([want[0], want[1]]));
    assert_eq!(v["detectedLanguage"][1]["language"], "de");
    assert!(v["detectedLanguage"][0]["confidence"].as_f64().unwrap() > 0.0);
    // The other endpoints.
    let (st, head, v) = s.get("/languages");
    assert_eq!(st, 200);
    assert!(head
        .to_ascii_lowercase()
        .contains("access-control-allow-origin: *"));
    assert_eq!(
        v,
        json!([{"code": "de", "name": "German", "targets": ["en"]}, {"code": "en", "name": "English", "targets": []}])
    );
    let (st, v) = s.json("/languages", &json!({}));
    assert_eq!((st, v[0]["code"].as_str()), (200, Some("de")));
    let (_, v) = s.json("/detect", &json!({"q": "zwei katzen schlafen"}));
    assert_eq!(v[0]["language"], "de");
    assert_eq!(s.get("/health").2, json!({"status": "ok"}));
    let (_, _, v) = s.get("/frontend/settings");
    assert_eq!(v["language"]["source"]["code"], "auto");
    assert_eq!(v["keyRequired"], false);
    // CORS preflight.
    let (st, head, _) = s.request("OPTIONS", "/translate", "", b"");
    assert_eq!(st, 204);
    assert!(head
        .to_ascii_lowercase()
        .contains("access-control-allow-methods: get, post"));
    // The log has a line per request.
    let (status, log) = s.stop();
    assert!(status.success(), "exit 0 on SIGTERM: {log}");
    assert!(log.contains("POST /translate 200 6 sentences"), "{log}");
    assert!(log.contains("stopped after"), "{log}");
}

fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".into(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[test]
fn html_keeps_markup_nesting_and_entities() {
    // Each text node is translated on its own.
    let want = mt_translate(&[
        "ein hund läuft",
        "zwei",
        "katzen",
        "schlafen im haus .",
        "ein & haus",
    ]);
    let s = Server::start(&[]);
    let q = "<p>ein hund läuft <b>zwei <i>katzen</i></b><br>schlafen im haus .</p>\
             <p><a href=\"https://example.org/?a=1&amp;b=2\">ein &amp; haus</a> .</p>";
    let (st, v) = s.json(
        "/translate",
        &json!({"q": [q], "source": "de", "target": "en", "format": "html"}),
    );
    assert_eq!(st, 200, "{v}");
    let out = v["translatedText"][0].as_str().unwrap();
    let esc = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let expect = format!(
        "<p>{} <b>{} <i>{}</i></b><br>{}</p><p><a href=\"https://example.org/?a=1&amp;b=2\">{}</a> .</p>",
        esc(&want[0]),
        esc(&want[1]),
        esc(&want[2]),
        esc(&want[3]),
        esc(&want[4])
    );
    assert_eq!(out, expect);
}

#[test]
fn batching_across_requests_changes_no_answer() {
    let sentences: Vec<String> = (0..24)
        .map(|i| {
            let w = [
                "ein", "hund", "läuft", "schnell", "zwei", "katzen", "schlafen", "im", "haus",
            ];
            (0..(2 + i % 6))
                .map(|j| w[(i * 5 + j * 7) % 9])
                .collect::<Vec<_>>()
                .join(" ")
                + " ."
        })
        .collect();
    let refs: Vec<&str> = sentences.iter().map(|s| s.as_str()).collect();
    let batched = mt_translate(&refs);
    // Requests arriving within the window (100 ms here) are translated together.
    let s = Server::start(&["--batch-wait-ms", "100"]);
    let port = s.port;
    let threads: Vec<_> = sentences
        .iter()
        .cloned()
        .map(|q| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let body = json!({"q": q, "source": "de", "target": "en"}).to_string();
                write!(
                    c,
                    "POST /translate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                let mut buf = String::new();
                c.read_to_string(&mut buf).unwrap();
                let v: Value = serde_json::from_str(buf.split("\r\n\r\n").nth(1).unwrap()).unwrap();
                v["translatedText"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let got: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(got, batched, "each answer is what mt translate prints");
    // And what each sentence gets alone: one request at a time, each its own batch.
    let single = Server::start(&["--batch-wait-ms", "0"]);
    for (q, g) in sentences.iter().zip(&got) {
        let (_, v) = single.json(
            "/translate",
            &json!({"q": q, "source": "de", "target": "en"}),
        );
        assert_eq!(v["translatedText"], g.as_str(), "{q}: alone and in a batch");
    }
    let (status, log) = s.stop();
    assert!(status.success());
    // Fewer batches than requests: they were translated together.
    let batches: usize = log
        .split(" batches")
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {log}"));
    assert!(
        batches < sentences.len(),
        "{batches} batches for {} requests",
        sentences.len()
    );
}

#[test]
fn native_endpoint_gives_scores_nbest_and_alignment() {
    let want = mt_translate(&[LINES[0]]);
    let s = Server::start(&[]);
    let (st, v) = s.json(
        "/v1/translate",
        &json!({"q": [LINES[0]], "source": "de", "target": "en", "n_best": 3, "alignment": true}),
    );
    assert_eq!(st, 200, "{v}");
    let t = &v["translations"][0];
    assert_eq!(t["text"], want[0]);
    let nbest = t["n_best"].as_array().unwrap();
    assert!(nbest.len() >= 2 && nbest.len() <= 3, "{t}");
    assert_eq!(nbest[0]["text"], want[0]);
    let scores: Vec<f64> = nbest
        .iter()
        .map(|h| h["normalized_score"].as_f64().unwrap())
        .collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "best first: {scores:?}"
    );
    assert!(t["score"].as_f64().unwrap() < 0.0);
    let (out, src) = (
        t["tokens"].as_array().unwrap().len(),
        t["source_tokens"].as_array().unwrap().len(),
    );
    let al = t["alignment"].as_array().unwrap();
    assert_eq!(al.len(), out);
    for (i, pair) in al.iter().enumerate() {
        assert_eq!(pair[0].as_u64().unwrap() as usize, i);
        assert!((pair[1].as_u64().unwrap() as usize) < src);
    }
    // The attention page of one sentence.
    let (st, _, b) = s.request(
        "POST",
        "/v1/attention",
        "application/json",
        json!({"q": LINES[1], "source": "de", "target": "en"})
            .to_string()
            .as_bytes(),
    );
    let page = String::from_utf8(b).unwrap();
    assert_eq!(st, 200);
    assert!(page.contains("Attention explorer") && page.contains("\"cross\":[["));
}

#[test]
fn api_keys_are_required_when_configured() {
    let keys = run_dir().with_file_name("keys.txt");
    std::fs::write(
        &keys,
        "# operators' keys\nsecret-1\n\nsecret-2  # the second\n",
    )
    .unwrap();
    let s = Server::start(&["--api-keys", keys.to_str().unwrap()]);
    let q = |k: Option<&str>| {
        let mut b = json!({"q": LINES[2], "source": "de", "target": "en"});
        if let Some(k) = k {
            b["api_key"] = json!(k);
        }
        s.json("/translate", &b)
    };
    assert_eq!(q(None).0, 403);
    let (st, v) = q(Some("wrong"));
    assert_eq!((st, v["error"].as_str()), (403, Some("Invalid API key")));
    assert_eq!(q(Some("secret-2")).0, 200);
    assert_eq!(s.get("/languages").0, 200, "listing needs no key");
    assert_eq!(s.get("/frontend/settings").2["keyRequired"], true);
}

#[test]
fn bad_input_never_takes_the_server_down() {
    let s = Server::start(&["--char-limit", "-1", "--header-timeout", "2"]);
    let rss_before = rss_kb(s.child.id());
    let ok = |s: &Server| {
        let (st, v) = s.json(
            "/translate",
            &json!({"q": LINES[2], "source": "de", "target": "en"}),
        );
        assert_eq!(st, 200, "still translating: {v}");
    };
    let err = |st: u16, body: &[u8]| -> String {
        let v: Value = serde_json::from_slice(body)
            .unwrap_or_else(|_| panic!("JSON error body: {:?}", String::from_utf8_lossy(body)));
        assert!(st >= 400);
        v["error"].as_str().unwrap().to_string()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "application/json",
            b"{\"q\": \"ein\", ".to_vec(),
            400,
            "Invalid JSON",
        ),
        (
            "application/json",
            b"[1, 2]".to_vec(),
            400,
            "Invalid JSON format",
        ),
        (
            "application/json",
            br#"{"q": 5, "source": "de", "target": "en"}"#.to_vec(),
            400,
            "q must be",
        ),
        (
            "application/json",
            br#"{"q": ["a", 3], "source": "de", "target": "en"}"#.to_vec(),
            400,
            "q must be",
        ),
        (
            "application/json",
            br#"{"q": "ein", "source": 1, "target": "en"}"#.to_vec(),
            400,
            "source must be a string",
        ),
        (
            "application/json",
            br#"{"source": "de", "target": "en"}"#.to_vec(),
            400,
            "missing q",
        ),
        (
            "application/json",
            br#"{"q": "", "source": "de", "target": "en"}"#.to_vec(),
            400,
            "missing q",
        ),
        (
            "application/json",
            br#"{"q": [], "source": "de", "target": "en"}"#.to_vec(),
            400,
            "missing q",
        ),
        (
            "application/json",
            br#"{"q": "ein", "target": "en"}"#.to_vec(),
            400,
            "missing source",
        ),
        (
            "application/json",
            br#"{"q": "ein", "source": "de", "target": "fr"}"#.to_vec(),
            400,
            "fr is not supported",
        ),
        (
            "application/json",
            br#"{"q": "ein", "source": "en", "target": "de"}"#.to_vec(),
            400,
            "not available as a target",
        ),
        (
            "application/json",
            br#"{"q": "ein", "source": "de", "target": "en", "format": "xml"}"#.to_vec(),
            400,
            "xml format is not supported",
        ),
        (
            "application/json",
            br#"{"q": "ein", "source": "de", "target": "en", "alternatives": "abc"}"#.to_vec(),
            400,
            "alternatives parameter is not a number",
        ),
        (
            "application/json",
            b"{\"q\": \"ein \xff\xfe\", \"source\": \"de\", \"target\": \"en\"}".to_vec(),
            400,
            "Invalid JSON",
        ),
        (
            "application/x-www-form-urlencoded",
            b"q=ein%20\xff&source=de&target=en".to_vec(),
            400,
            "not UTF-8",
        ),
    ];
    for (ctype, body, status, msg) in &cases {
        let (st, head, b) = s.request("POST", "/translate", ctype, body);
        let e = err(st, &b);
        assert_eq!(st, *status, "{e}");
        assert!(e.contains(msg), "{e:?} should say {msg:?}");
        assert!(head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: *"));
    }
    // A 10 MB body: 413.
    let big = vec![b'a'; 10 << 20];
    let (st, _, b) = s.request("POST", "/translate", "application/json", &big);
    assert_eq!(st, 413, "{}", err(st, &b));
    // 10,000 strings in one q: the batch limit.
    let many: Vec<&str> = vec!["ein"; 10_000];
    let (st, v) = s.json(
        "/translate",
        &json!({"q": many, "source": "de", "target": "en"}),
    );
    assert_eq!(st, 400);
    assert!(
        v["error"].as_str().unwrap().contains("batch limit (256)"),
        "{v}"
    );
    // A 5,000-word sentence: refused with the model's limit, beside a good text.
    let long = vec!["hund"; 5000].join(" ");
    let (st, v) = s.json(
        "/translate",
        &json!({"q": [LINES[0], long], "source": "de", "target": "en"}),
    );
    assert_eq!(st, 400);
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("text 2") && e.contains("at most"), "{e}");
    ok(&s);
    // Unknown paths and methods.
    assert_eq!(s.get("/nope").0, 404);
    assert_eq!(s.request("POST", "/health", "", b"").0, 405);
    // A client that sends its headers one byte a second is cut off after the header timeout,
    // and others are answered meanwhile.
    let slow_port = s.port;
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", slow_port)).unwrap();
        let t = Instant::now();
        for b in b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" {
            if c.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1000));
            if t.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    ok(&s);
    let cut = slow.join().unwrap();
    assert!(
        cut < Duration::from_secs(8),
        "the slow client was cut off ({cut:?})"
    );
    // A client that goes away mid-body, and one that goes away before its answer.
    {
        let mut c = s.connect();
        c.write_all(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"q\": ").unwrap();
    }
    {
        let mut c = s.connect();
        let body = json!({"q": LINES[1], "source": "de", "target": "en"}).to_string();
        write!(c, "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    }
    // Memory stays bounded through all of it.
    let rss_after_bad = rss_kb(s.child.id());
    // 1,000 connections at once.
    let conns: Vec<TcpStream> = (0..1000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", s.port)).ok())
        .collect();
    assert!(conns.len() >= 900, "{} connections opened", conns.len());
    drop(conns);
    ok(&s);
    let rss = rss_kb(s.child.id());
    assert!(
        rss < rss_before + 200_000 && rss < rss_after_bad + 100_000,
        "resident memory {rss_before} kB at start, {rss_after_bad} kB after the bad requests, {rss} kB at the end"
    );
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// Resident memory of a process, kB (Linux).
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn several_runs_are_routed_by_pair_and_source_auto_detects() {
    let want = mt_translate(&[LINES[1]]);
    let (de, ko) = (
        format!("de:en={}", run_dir().display()),
        format!("ko:en={}", run_dir().display()),
    );
    let s = Server::start(&["--run", &de, "--run", &ko]);
    let (_, _, v) = s.get("/languages");
    let codes: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, vec!["de", "en", "ko"], "{v}");
    let (st, v) = s.json(
        "/translate",
        &json!({"q": [LINES[1], "고양이 두 마리가 집에서 잔다 ."], "source": "auto", "target": "en"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["detectedLanguage"][0]["language"], "de");
    assert_eq!(v["detectedLanguage"][1]["language"], "ko");
    assert_eq!(v["translatedText"][0], want[0]);
    let (_, d) = s.json("/detect", &json!({"q": "고양이 두 마리"}));
    assert_eq!(d[0]["language"], "ko");
    // The same pair twice is refused at start.
    let out = bin()
        .arg("serve")
        .args(["--run", &de, "--run", &de, "--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("served twice"));
}

#[test]
fn a_full_queue_answers_429_at_once() {
    let s = Server::start(&["--max-queue", "4", "--batch-wait-ms", "1500"]);
    let port = s.port;
    let first = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = json!({"q": &LINES[..4], "source": "de", "target": "en"}).to_string();
        write!(c, "POST /translate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut buf = String::new();
        c.read_to_string(&mut buf).unwrap();
        buf
    });
    std::thread::sleep(Duration::from_millis(400));
    let t = Instant::now();
    let (st, v) = s.json(
        "/translate",
        &json!({"q": LINES[4], "source": "de", "target": "en"}),
    );
    assert_eq!(st, 429, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("Slowdown:"));
    assert!(t.elapsed() < Duration::from_millis(900), "refused at once");
    assert!(first.join().unwrap().starts_with("HTTP/1.1 200"));
}

#[test]
fn sigterm_finishes_the_requests_in_flight() {
    let s = Server::start(&["--batch-wait-ms", "1000"]);
    let port = s.port;
    let inflight = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = json!({"q": LINES[0], "source": "de", "target": "en"}).to_string();
        write!(c, "POST /translate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut buf = String::new();
        c.read_to_string(&mut buf).unwrap();
        buf
    });
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let answer = inflight.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Python with `libretranslatepy==2.1.4`: `TRANSFORMER_CLIENTS_PYTHON`, or a virtualenv made
/// here under target/. Where it cannot be had (no network), the test is skipped unless
/// `TRANSFORMER_REQUIRE_CLIENTS=1` (as `.ci/run` sets).
fn client_python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TRANSFORMER_CLIENTS_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = repo_root().join("target/clients-venv");
    let py = venv.join("bin/python");
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import libretranslatepy"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if py.exists() && has(&py) {
        return Some(py);
    }
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(&py)
            .args(["-m", "pip", "install", "-q", "libretranslatepy==2.1.4"])
            .status()
            .is_ok_and(|s| s.success());
    if made && has(&py) {
        return Some(py);
    }
    assert!(
        std::env::var("TRANSFORMER_REQUIRE_CLIENTS").is_err(),
        "libretranslatepy could not be installed and TRANSFORMER_REQUIRE_CLIENTS is set"
    );
    None
}

#[test]
fn real_clients_libretranslatepy_and_a_mastodon_request() {
    let Some(python) = client_python() else {
        eprintln!(
            "SKIPPED: no Python with libretranslatepy==2.1.4 (set TRANSFORMER_CLIENTS_PYTHON)"
        );
        return;
    };
    let texts = [LINES[0], LINES[1], LINES[3]];
    let want = mt_translate(&texts);
    let s = Server::start(&[]);
    let out = Command::new(&python)
        .arg(repo_root().join("scripts/serve_clients.py"))
        .arg(format!("http://127.0.0.1:{}", s.port))
        .args(["--source", "de", "--target", "en"])
        .args(texts)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["translate_one"], want[0]);
    assert_eq!(v["translate_each"], json!(want));
    assert_eq!(v["languages"][0]["code"], "de");
    assert_eq!(v["languages"][0]["targets"], json!(["en"]));
    assert_eq!(v["detect"][0]["language"], "de");
    // Mastodon: q a list, format html, source auto; it reads translatedText[i] and
    // detectedLanguage[i].language.
    let esc = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let m = &v["mastodon"];
    for (i, w) in want.iter().enumerate() {
        assert_eq!(m["translatedText"][i], format!("<p>{}</p>", esc(w)));
        assert_eq!(m["detectedLanguage"][i]["language"], "de");
    }
}

#[test]
fn web_page_translates_as_you_type_in_chromium() {
    let want = mt_translate(&[LINES[1]]);
    let s = Server::start(&[]);
    let (st, head, page) = s.request("GET", "/", "", b"");
    let page = String::from_utf8(page).unwrap();
    assert_eq!(st, 200);
    assert!(head.to_ascii_lowercase().contains("text/html"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "self-contained"
    );
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED the browser part: no Chromium (install chromium or set CHROMIUM)");
        return;
    };
    // The page types the fragment's text into its box (the input event typing fires) and
    // translates it; the DOM after the scripts ran must show the translation.
    let url = format!(
        "http://127.0.0.1:{}/#type={}",
        s.port,
        form_urlencoded(&[("", LINES[1])]).trim_start_matches('=')
    );
    let profile = run_dir().with_file_name(format!("chromium-{}", std::process::id()));
    let shot = run_dir().with_file_name("page.png");
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=8000",
    ];
    let dom = Command::new(&browser)
        .args(flags)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    let expect = want[0]
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(
        dom.contains(&format!(
            "<div id=\"output\" aria-live=\"polite\">{expect}</div>"
        )),
        "the translation appears: {dom}"
    );
    let status = Command::new(&browser)
        .args(flags)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1000,700")
        .arg(&url)
        .output()
        .unwrap();
    assert!(status.status.success());
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// `mt translate` answers each line sent on a pipe before the next arrives (it streams), and
/// stops quietly with status 0 when its reader closes the pipe (`| head -1`).
#[test]
fn mt_translate_streams_and_ends_quietly_on_a_closed_pipe() {
    let want = mt_translate(&LINES);
    let mut child = bin()
        .args(["mt", "translate", "--run"])
        .arg(run_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    for (line, w) in LINES.iter().zip(&want) {
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut got = String::new();
        stdout.read_line(&mut got).unwrap();
        assert_eq!(
            got.trim_end_matches('\n'),
            w,
            "answered before the next line"
        );
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());

    // A file much longer than one chunk, read by `head -1`.
    let file = run_dir().with_file_name("long.de");
    let text: String = (0..3000)
        .map(|i| format!("{}\n", LINES[i % LINES.len()]))
        .collect();
    std::fs::write(&file, text).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' mt translate --run '{}' --src '{}' | head -1",
            env!("CARGO_BIN_EXE_transformer"),
            run_dir().display(),
            file.display()
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout.lines().next(), Some(want[0].as_str()), "{stdout}");
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("error"),
        "{stderr}"
    );
    // The translator's own status, through bash's PIPESTATUS.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' mt translate --run '{}' --src '{}' | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
            env!("CARGO_BIN_EXE_transformer"),
            run_dir().display(),
            file.display()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

/// With `--quantize int8` the server decodes in int8, and answers what `mt translate
/// --quantize int8` prints.
#[test]
fn int8_serving_answers_what_int8_mt_translate_prints() {
    let want = mt_translate_with(&LINES, &["--quantize", "int8"]);
    let s = Server::start(&["--quantize", "int8"]);
    let (st, v) = s.json(
        "/translate",
        &json!({"q": LINES, "source": "de", "target": "en"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["translatedText"], json!(want));
    let (_, log) = s.stop();
    assert!(log.contains("decoder layers int8"), "{log}");
}

/// `mt quantize` writes a run a quarter of the size that decodes in int8: `mt translate`
/// says so and translates every line; the same directory twice is refused.
#[test]
fn mt_quantize_writes_a_smaller_run_that_decodes_in_int8() {
    let out = run_dir().with_file_name(format!("int8-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let st = bin()
        .args(["mt", "quantize", "--run"])
        .arg(run_dir())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let size = |p: PathBuf| std::fs::metadata(p).unwrap().len();
    let (before, after) = (
        size(run_dir().join("best.safetensors")),
        size(out.join("best.safetensors")),
    );
    // (The tiny model's biases, norms and metadata are a larger share than the default's.)
    assert!(after * 2 < before, "{after} bytes against {before}");
    let (translated, stderr) = translate_run(&out, &LINES, &[]);
    assert!(stderr.contains("decoder layers int8"), "{stderr}");
    assert_eq!(translated.len(), LINES.len());
    let again = bin()
        .args(["mt", "quantize", "--run"])
        .arg(run_dir())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not an empty directory"));
}
