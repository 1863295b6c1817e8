//! `transformer serve` end to end: a small run trained here, served by the real binary on a
//! free port, driven over real TCP connections: LibreTranslate's API answering exactly what
//! `mt translate` prints, HTML kept, batching across requests that changes no answer, the
//! native endpoint, API keys, every kind of bad input leaving the server up. Routing, a full
//! queue, SIGTERM, the real clients and the web page are in `serve_ops.rs`.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;
use common::serve::*;

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
    // A url-encoded form, as libretranslatepy posts it, and a multipart form.
    let form: String = form_urlencoded(&[("q", LINES[3]), ("source", "de"), ("target", "en")]);
    let multipart = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"q\"\r\n\r\n{}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"source\"\r\n\r\nde\r\n--XyZ\r\nContent-Disposition: form-data; name=\"target\"\r\n\r\nen\r\n--XyZ--\r\n",
        LINES[4]
    );
    for (content_type, body, line) in [
        ("application/x-www-form-urlencoded", form, 3),
        ("multipart/form-data; boundary=XyZ", multipart, 4),
    ] {
        let (st, _, b) = s.request("POST", "/translate", content_type, body.as_bytes());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (st, v["translatedText"].as_str().unwrap()),
            (200, want[line].as_str())
        );
    }
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

/// What `mt translate` gives for each of `texts`, escaped as text in HTML (`&`, `<`, `>`).
fn mt_translate_as_html<const N: usize>(texts: [&str; N]) -> [String; N] {
    let out = mt_translate(&texts);
    std::array::from_fn(|i| {
        out[i]
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    })
}

#[test]
fn html_keeps_markup_nesting_and_entities() {
    // Each text node is translated on its own.
    let [dog_runs, two, cats, sleep, house] = mt_translate_as_html([
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
    let expect = format!(
        "<p>{dog_runs} <b>{two} <i>{cats}</i></b><br>{sleep}</p><p><a href=\"https://example.org/?a=1&amp;b=2\">{house}</a> .</p>"
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
    // (JSON body, what the error of its 400 says)
    let json_cases: Vec<(&[u8], &str)> = vec![
        (b"{\"q\": \"ein\", ", "Invalid JSON"),
        (b"[1, 2]", "Invalid JSON format"),
        (br#"{"q": 5, "source": "de", "target": "en"}"#, "q must be"),
        (
            br#"{"q": ["a", 3], "source": "de", "target": "en"}"#,
            "q must be",
        ),
        (
            br#"{"q": "ein", "source": 1, "target": "en"}"#,
            "source must be a string",
        ),
        (br#"{"source": "de", "target": "en"}"#, "missing q"),
        (br#"{"q": "", "source": "de", "target": "en"}"#, "missing q"),
        (br#"{"q": [], "source": "de", "target": "en"}"#, "missing q"),
        (br#"{"q": "ein", "target": "en"}"#, "missing source"),
        (
            br#"{"q": "ein", "source": "de", "target": "fr"}"#,
            "fr is not supported",
        ),
        (
            br#"{"q": "ein", "source": "en", "target": "de"}"#,
            "not available as a target",
        ),
        (
            br#"{"q": "ein", "source": "de", "target": "en", "format": "xml"}"#,
            "xml format is not supported",
        ),
        (
            br#"{"q": "ein", "source": "de", "target": "en", "alternatives": "abc"}"#,
            "alternatives parameter is not a number",
        ),
        (
            b"{\"q\": \"ein \xff\xfe\", \"source\": \"de\", \"target\": \"en\"}",
            "Invalid JSON",
        ),
    ];
    let form = (
        "application/x-www-form-urlencoded",
        &b"q=ein%20\xff&source=de&target=en"[..],
        "not UTF-8",
    );
    let cases = json_cases
        .into_iter()
        .map(|(body, msg)| ("application/json", body, msg))
        .chain([form]);
    for (ctype, body, msg) in cases {
        let (st, head, b) = s.request("POST", "/translate", ctype, body);
        let e = err(st, &b);
        assert_eq!(st, 400, "{e}");
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

#[test]
fn social_media_html_keeps_mentions_urls_hashtags_code_and_emoji() {
    // The prose around what is kept is translated piece by piece, in its place.
    let [dog_runs, cats_sleep, in_house, house] = mt_translate_as_html([
        "ein hund läuft",
        "zwei katzen schlafen",
        "im haus",
        "ein haus",
    ]);
    let mention = "<span class=\"h-card\"><a href=\"https://m.social/@bob\" class=\"u-url mention\">@<span>bob</span></a></span>";
    let link = "<a href=\"https://example.com/x\" rel=\"nofollow noopener\" target=\"_blank\"><span class=\"invisible\">https://</span><span class=\"\">example.com/x</span><span class=\"invisible\"></span></a>";
    let hashtag = "<a href=\"https://m.social/tags/katzen\" class=\"mention hashtag\" rel=\"tag\">#<span>katzen</span></a>";
    let kept = "<span translate=\"no\">ein hund</span> <code>zwei katzen</code> <span class=\"notranslate\">schlafen</span>";
    let bare = "🐶 https://a.org/b @ana@m.social #haus";
    let status = format!(
        "<p>ein hund läuft {mention} zwei katzen schlafen {link} {hashtag} 🐱</p>\
         <p>im haus {kept} ein haus {bare}</p>"
    );
    let expect = format!(
        "<p>{dog_runs} {mention} {cats_sleep} {link} {hashtag} 🐱</p>\
         <p>{in_house} {kept} {house} {bare}</p>"
    );
    let s = Server::start(&[]);
    let (st, v) = s.json(
        "/translate",
        &json!({"q": [&status], "source": "de", "target": "en", "format": "html"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["translatedText"][0].as_str().unwrap(), expect);
    // A link whose text is words is translated.
    let (_, v) = s.json(
        "/translate",
        &json!({"q": "<a href=\"https://a.org/\">ein haus</a>", "source": "de", "target": "en", "format": "html"}),
    );
    assert_eq!(
        v["translatedText"],
        format!("<a href=\"https://a.org/\">{house}</a>")
    );
}

#[test]
fn a_paragraph_is_translated_sentence_by_sentence() {
    let sentences = [
        "ein hund läuft schnell !",
        "zwei katzen schlafen im haus ?",
        "ein haus .",
    ];
    let each = mt_translate_with(&sentences, &["--no-split-sentences"]);
    let paragraph = format!("{}  {}\t{}", sentences[0], sentences[1], sentences[2]);
    let expect = format!("{}  {}\t{}", each[0], each[1], each[2]);
    // mt translate cuts the line into its sentences and keeps the spacing.
    assert_eq!(mt_translate(&[&paragraph]), [expect.clone()]);
    // The server does the same, in text and in a list.
    let s = Server::start(&[]);
    let (st, v) = s.json(
        "/translate",
        &json!({"q": [&paragraph, sentences[2]], "source": "de", "target": "en"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["translatedText"], json!([expect, each[2]]));
    // mt eval --split-sentences scores the joined translations.
    let dir = run_dir().with_file_name("paragraphs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("p.de"), format!("{paragraph}\n")).unwrap();
    std::fs::write(
        dir.join("p.en"),
        "a dog runs fast ! two cats sleep in the house ? a house .\n",
    )
    .unwrap();
    let out = common::bin()
        .args(["mt", "eval", "--split-sentences", "--run"])
        .arg(run_dir())
        .arg("--src")
        .arg(dir.join("p.de"))
        .arg("--ref")
        .arg(dir.join("p.en"))
        .arg("--hyp-out")
        .arg(dir.join("p.hyp"))
        .output()
        .unwrap();
    common::succeeded(&out);
    assert_eq!(
        std::fs::read_to_string(dir.join("p.hyp")).unwrap(),
        format!("{expect}\n")
    );
}

#[test]
fn source_auto_refuses_a_language_no_served_model_reads() {
    let s = Server::start(&[]);
    // Korean to a server of German alone: refused, naming both, and /detect says 0.
    let (st, v) = s.json(
        "/translate",
        &json!({"q": "고양이 두 마리가 집에서 잔다.", "source": "auto", "target": "en"}),
    );
    assert_eq!(st, 400, "{v}");
    let err = v["error"].as_str().unwrap();
    assert!(
        err.contains("Korean (ko)") && err.contains("German (de)"),
        "{err}"
    );
    let (_, d) = s.json("/detect", &json!({"q": "고양이 두 마리가 집에서 잔다."}));
    assert_eq!(d, json!([{"confidence": 0.0, "language": "de"}]));
    // English is no better: it reads as English.
    let (st, v) = s.json(
        "/translate",
        &json!({"q": "The man and the woman are walking with the dog in the park.", "source": "auto", "target": "en"}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("English (en)"), "{v}");
    // German is translated, with its confidence.
    let (st, v) = s.json(
        "/translate",
        &json!({"q": LINES[1], "source": "auto", "target": "en"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["translatedText"], mt_translate(&[LINES[1]])[0]);
    let c = v["detectedLanguage"]["confidence"].as_f64().unwrap();
    assert!(c >= 10.0 && c <= 100.0, "{v}");
}

#[test]
fn an_oversized_body_from_python_gets_its_413_and_a_bad_escape_its_400() {
    let s = Server::start(&[]);
    // Python's urllib writes the whole body before it reads the answer: it must read the
    // 413, not a reset connection.
    let script = r#"
import json, sys, urllib.error, urllib.request
for size in (3_000_000, 12_000_000):
    body = json.dumps({"q": "x" * size, "source": "de", "target": "en"}).encode()
    req = urllib.request.Request(sys.argv[1], data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        print("200")
    except urllib.error.HTTPError as e:
        print(e.code, json.loads(e.read())["error"])
    except Exception as e:
        print("failed:", type(e).__name__, e)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(format!("http://127.0.0.1:{}/translate", s.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        assert!(l.starts_with("413 Request body too large"), "{text}");
    }
    // A %-escape that decodes to invalid UTF-8 in a form is refused, as in JSON.
    for body in [
        "q=%FF&source=de&target=en",
        "q=ein+hund&source=d%C3e&target=en",
    ] {
        let (st, _, b) = s.request(
            "POST",
            "/translate",
            "application/x-www-form-urlencoded",
            body.as_bytes(),
        );
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(st, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains("not UTF-8"), "{v}");
    }
    // A valid form still translates, `+` a space and `%C3%A4` an ä.
    let (st, _, b) = s.request(
        "POST",
        "/translate",
        "application/x-www-form-urlencoded",
        b"q=ein+hund+l%C3%A4uft+schnell+.&source=de&target=en",
    );
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (st, &v["translatedText"]),
        (200, &json!(mt_translate(&[LINES[0]])[0]))
    );
    // The server is still up.
    assert_eq!(s.get("/health").2, json!({"status": "ok"}));
}
