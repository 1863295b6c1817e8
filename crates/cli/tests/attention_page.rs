//! The attention explorer page in a real browser: headless Chromium (the distribution's
//! package) loads it with no script error, the script draws the heatmap, and a screenshot
//! shows it. Where no Chromium is installed (set `CHROMIUM` to its path, or install the
//! `chromium` package) the test says so and checks only the page's text.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use transformer_runtime::viz::{attention_html, AttentionSet};

mod common;
use common::chromium;

/// A two-layer, two-head Transformer's attentions over a 4-token source, with one sharp
/// weight per row so the picture has dark cells.
fn sample() -> AttentionSet {
    let sharp = |rows: usize, cols: usize| -> Vec<Vec<f32>> {
        (0..rows)
            .map(|i| {
                (0..cols)
                    .map(|j| {
                        if j == i.min(cols - 1) {
                            0.9
                        } else {
                            0.1 / (cols - 1) as f32
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let layers = |rows, cols| vec![vec![sharp(rows, cols); 2]; 2];
    AttentionSet {
        source: "Ein Hund läuft.".into(),
        translation: "A dog runs.".into(),
        src_tokens: ["▁Ein", "▁Hund", "▁läuft", "."].map(String::from).to_vec(),
        tgt_in_tokens: ["<bos>", "▁A", "▁dog", "▁runs", "."]
            .map(String::from)
            .to_vec(),
        tgt_out_tokens: ["▁A", "▁dog", "▁runs", ".", "<eos>"]
            .map(String::from)
            .to_vec(),
        encoder: layers(4, 4),
        decoder: layers(5, 5),
        cross: layers(5, 4),
        model: "transformer".into(),
    }
}

/// The RGB(A) pixels of an 8-bit, non-interlaced PNG: (width, height, channels, bytes).
fn decode_png(path: &Path) -> (usize, usize, usize, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut pos, mut idat) = (8, Vec::new());
    let (mut w, mut h, mut channels) = (0, 0, 0);
    while pos + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let data = &bytes[pos + 8..pos + 8 + len];
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
                h = u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize;
                assert_eq!(data[8], 8, "bit depth");
                channels = match data[9] {
                    2 => 3,
                    6 => 4,
                    c => panic!("colour type {c}"),
                };
                assert_eq!(data[12], 0, "interlaced");
            }
            b"IDAT" => idat.extend_from_slice(data),
            _ => {}
        }
        pos += 12 + len;
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&idat[..])
        .read_to_end(&mut raw)
        .unwrap();
    let stride = w * channels;
    let mut out = vec![0u8; h * stride];
    for y in 0..h {
        let filter = raw[y * (stride + 1)];
        let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for x in 0..stride {
            let a = if x >= channels {
                out[y * stride + x - channels] as i32
            } else {
                0
            };
            let b = if y > 0 {
                out[(y - 1) * stride + x] as i32
            } else {
                0
            };
            let c = if x >= channels && y > 0 {
                out[(y - 1) * stride + x - channels] as i32
            } else {
                0
            };
            let pred = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let p = a + b - c;
                    let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("filter {f}"),
            };
            out[y * stride + x] = (line[x] as i32 + pred) as u8;
        }
    }
    (w, h, channels, out)
}

#[test]
fn explorer_page_loads_without_script_errors_and_shows_the_heatmap() {
    let dir = std::env::temp_dir().join(format!("attention-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("attention.html");
    let html = attention_html(&sample());
    assert!(!html.contains("<script src") && !html.contains("http"));
    std::fs::write(&page, &html).unwrap();
    let Some(browser) = chromium() else {
        eprintln!(
            "no Chromium found (install the `chromium` package or set CHROMIUM): checked the \
             page's text only, not its rendering"
        );
        return;
    };
    let url = format!("file://{}", page.display());
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=900,700",
        "--enable-logging=stderr",
        "--v=0",
    ];
    // The DOM after the script ran: the heatmap is a table of coloured cells.
    let out = Command::new(&browser)
        .args(common)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("running Chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !log.contains("Uncaught") && !log.contains("SyntaxError"),
        "script errors:\n{log}"
    );
    // 5 output tokens x 4 source tokens, each cell coloured by the script.
    assert_eq!(dom.matches("background: rgb(").count(), 20, "{dom}");
    assert!(dom.contains("heads averaged"), "{dom}");
    // A screenshot shows it: dark blue cells (the 0.9 weights) on white.
    let shot = dir.join("attention.png");
    let out = Command::new(&browser)
        .args(common)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .expect("running Chromium");
    assert!(shot.exists(), "{}", String::from_utf8_lossy(&out.stderr));
    let (w, h, ch, px) = decode_png(&shot);
    let dark_blue = (0..w * h)
        .filter(|i| {
            let p = &px[i * ch..i * ch + 3];
            let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
            b > 90 && b - r > 60 && b - g > 20
        })
        .count();
    // Each 0.9 cell is about 30 x 30 pixels; five of them are drawn.
    assert!(
        dark_blue > 5 * 400,
        "{dark_blue} dark blue pixels in {}",
        shot.display()
    );
}
