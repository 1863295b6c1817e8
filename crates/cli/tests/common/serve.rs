//! The serve tests' shared pieces: the small run they serve, what `mt translate` prints
//! for it, and the server driven over real TCP connections.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::{bin, mt_translate_stdin, write_toy_run_files};

/// The training settings of the served run.
const SETTINGS: &str =
    "lr_factor = 0.7\nepochs = 30\nmax_tokens = 160\nlog_interval = 20\nbeam = 3\n";

/// A small German -> English run, trained once for every test of this file.
pub fn run_dir() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("serve-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        write_toy_run_files(&dir, &[("train", 300), ("valid", 20)], false, SETTINGS);
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
pub fn mt_translate(lines: &[&str]) -> Vec<String> {
    mt_translate_with(lines, &[])
}

/// What `mt translate` with these extra flags prints for these lines.
pub fn mt_translate_with(lines: &[&str], flags: &[&str]) -> Vec<String> {
    translate_run(run_dir(), lines, flags).0
}

/// `mt translate --run RUN` with `flags` on these lines: its output lines and its stderr;
/// it must succeed.
pub fn translate_run(run: &Path, lines: &[&str], flags: &[&str]) -> (Vec<String>, String) {
    let out = mt_translate_stdin(run, flags, &(lines.join("\n") + "\n"));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (lines, stderr)
}

pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let log = run_dir().with_file_name(format!("server-{n}.log"));
        let mut cmd = bin();
        cmd.arg("serve");
        if !extra.contains(&"--run") && !extra.contains(&"--model") {
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

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// Sends raw bytes as one request and returns (status, headers, body).
    pub fn raw(&self, request: &[u8]) -> (u16, String, Vec<u8>) {
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

    pub fn request(
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

    pub fn json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, b) = self.request(
            "POST",
            path,
            "application/json",
            body.to_string().as_bytes(),
        );
        (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    pub fn get(&self, path: &str) -> (u16, String, Value) {
        let (status, head, b) = self.request("GET", path, "", b"");
        (
            status,
            head,
            serde_json::from_slice(&b).unwrap_or(Value::Null),
        )
    }

    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
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
    pub fn libc_kill(pid: i32, sig: i32) -> i32;
}

pub const LINES: [&str; 6] = [
    "ein hund läuft schnell .",
    "zwei katzen schlafen im haus .",
    "ein haus .",
    "katzen schlafen .",
    "zwei hund läuft im haus schnell .",
    "im haus schlafen zwei katzen .",
];

pub fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
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

/// Resident memory of a process, kB (Linux).
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
