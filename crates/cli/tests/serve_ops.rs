//! `transformer serve` end to end, continued: several runs routed by pair, a full queue,
//! SIGTERM, the real `libretranslatepy` client and a Mastodon-shaped request
//! (`scripts/serve_clients.py`), the web page in headless Chromium, streaming and int8
//! serving. The shared pieces are in `common/serve.rs`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::serve::*;
use common::{bin, chromium, failure_stderr, repo_root, succeeded};

/// Python with `libretranslatepy==2.1.4`: `TRANSFORMER_CLIENTS_PYTHON`, or a virtualenv made
/// here under target/. Where it cannot be had (no network), the test is skipped unless
/// `TRANSFORMER_REQUIRE_CLIENTS=1` (as `.ci/run` sets), and says so.
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
    eprintln!("SKIPPED: no Python with libretranslatepy==2.1.4 (set TRANSFORMER_CLIENTS_PYTHON)");
    None
}

/// What the real clients got from the server `s` for German `texts` into English
/// (`scripts/serve_clients.py`).
fn clients(python: &Path, s: &Server, texts: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(repo_root().join("scripts/serve_clients.py"))
        .arg(format!("http://127.0.0.1:{}", s.port))
        .args(["--source", "de", "--target", "en"])
        .args(texts)
        .output()
        .unwrap();
    succeeded(&out);
    serde_json::from_slice(&out.stdout).unwrap()
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

#[test]
fn real_clients_libretranslatepy_and_a_mastodon_request() {
    let Some(python) = client_python() else {
        return;
    };
    let texts = [LINES[0], LINES[1], LINES[3]];
    let want = mt_translate(&texts);
    let s = Server::start(&[]);
    let v = clients(&python, &s, &texts);
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
    // `mt translate` of the file piped into `head -1`, then `after`, by `shell`.
    let into_head = |shell: &str, after: &str| {
        Command::new(shell)
            .arg("-c")
            .arg(format!(
                "'{}' mt translate --run '{}' --src '{}' | head -1{after}",
                env!("CARGO_BIN_EXE_transformer"),
                run_dir().display(),
                file.display()
            ))
            .output()
            .unwrap()
    };
    let out = into_head("sh", "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout.lines().next(), Some(want[0].as_str()), "{stdout}");
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("error"),
        "{stderr}"
    );
    // The translator's own status, through bash's PIPESTATUS.
    let out = into_head("bash", " >/dev/null; echo ${PIPESTATUS[0]}");
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
    let quantize = || {
        bin()
            .args(["mt", "quantize", "--run"])
            .arg(run_dir())
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    succeeded(&quantize());
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
    assert!(failure_stderr(&quantize()).contains("not an empty directory"));
}

#[test]
fn web_page_asks_for_the_api_key_and_sends_it_in_chromium() {
    let want = mt_translate(&[LINES[1]]);
    let keys = run_dir().with_file_name("page-keys.txt");
    std::fs::write(&keys, "page-key\n").unwrap();
    let s = Server::start(&["--api-keys", keys.to_str().unwrap()]);
    let (_, _, page) = s.request("GET", "/", "", b"");
    let page = String::from_utf8(page).unwrap();
    assert!(page.contains("id=\"apikey\"") && page.contains("api_key"));
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED the browser part: no Chromium (install chromium or set CHROMIUM)");
        return;
    };
    let text = form_urlencoded(&[("", LINES[1])]);
    let profile = run_dir().with_file_name(format!("chromium-key-{}", std::process::id()));
    let dom_of = |hash: &str| {
        let out = Command::new(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--virtual-time-budget=8000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--dump-dom")
            .arg(format!("http://127.0.0.1:{}/#{hash}", s.port))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let expect = want[0]
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    // With the key the page translates; without, it shows the server's refusal.
    let dom = dom_of(&format!("key=page-key&type{text}"));
    assert!(
        dom.contains(&format!(
            "<div id=\"output\" aria-live=\"polite\">{expect}</div>"
        )),
        "{dom}"
    );
    let dom = dom_of(&format!("type{text}"));
    assert!(dom.contains("missing api_key"), "{dom}");
}

/// An Argos Translate package served directly (`--model pkg.argosmodel`) answers the real
/// libretranslatepy client as LibreTranslate with that package would: its languages with the
/// package's names, and the translations `mt translate` gives with the package imported.
#[test]
fn an_argos_package_is_served_to_libretranslatepy() {
    let Some(python) = client_python() else {
        return;
    };
    let package = repo_root().join("crates/runtime/tests/fixtures/marian/de_en.argosmodel");
    let imported = run_dir().with_file_name(format!("argos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&imported);
    succeeded(
        &bin()
            .arg("import")
            .arg(&package)
            .arg("--out")
            .arg(&imported)
            .output()
            .unwrap(),
    );
    let texts = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."];
    let (want, _) = translate_run(&imported, &texts, &[]);
    assert_eq!(want.len(), 2, "{want:?}");
    let package_arg = package.to_string_lossy().to_string();
    let s = Server::start(&["--model", &package_arg]);
    let v = clients(&python, &s, &texts);
    assert_eq!(v["translate_each"], json!(want));
    let langs = &v["languages"];
    assert_eq!(langs[0]["code"], "de");
    assert_eq!(langs[0]["name"], "German");
    assert_eq!(langs[0]["targets"], json!(["en"]));
    assert_eq!(langs[1]["name"], "English");
    let _ = std::fs::remove_dir_all(&imported);
}
