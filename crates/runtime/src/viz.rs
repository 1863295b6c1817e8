//! Pictures for a person: heatmaps (which word attends to which; the positional-encoding
//! matrix) as SVG, and one self-contained HTML page to explore every attention of a
//! translation, layer by layer and head by head.
//!
//! Written by hand, like the loss plot (`transformer_train::metrics::plot_svg`): a heatmap is a grid of
//! rectangles, tick labels and a colour bar, and the page is a table redrawn by a few lines of
//! script, so neither needs a plotting crate's dependency tree in a build on 2 cores.

use std::fmt::Write as _;

/// How values map to colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// 0 to 1, white to dark blue (attention weights).
    Unit,
    /// -1 to 1, blue through white to red (sinusoids).
    Signed,
}

/// A matrix to draw, with a label for every row and column.
#[derive(Debug, Clone)]
pub struct Heatmap {
    /// The title above the picture.
    pub title: String,
    /// One label per row (drawn on the left), e.g. the target tokens.
    pub rows: Vec<String>,
    /// One label per column (drawn on top), e.g. the source tokens.
    pub cols: Vec<String>,
    /// `rows.len()` rows of `cols.len()` values.
    pub values: Vec<Vec<f32>>,
    /// The colour scale.
    pub scale: Scale,
    /// What the rows are (the left axis title).
    pub row_axis: String,
    /// What the columns are (the top axis title).
    pub col_axis: String,
}

/// `s` with the five XML special characters escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// The colour of `v` on `scale`, as `#rrggbb`.
pub fn colour(v: f32, scale: Scale) -> String {
    let lerp = |a: [f32; 3], b: [f32; 3], t: f32| -> [f32; 3] {
        [
            a[0] + (b[0] - a[0]) * t,
            a[1] + (b[1] - a[1]) * t,
            a[2] + (b[2] - a[2]) * t,
        ]
    };
    let white = [255.0, 255.0, 255.0];
    let rgb = match scale {
        Scale::Unit => {
            let t = if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            };
            // White -> mid blue -> dark navy: the eye reads small weights as near-white.
            if t < 0.5 {
                lerp(white, [107.0, 174.0, 214.0], t * 2.0)
            } else {
                lerp([107.0, 174.0, 214.0], [8.0, 48.0, 107.0], (t - 0.5) * 2.0)
            }
        }
        Scale::Signed => {
            let t = if v.is_finite() {
                v.clamp(-1.0, 1.0)
            } else {
                0.0
            };
            if t < 0.0 {
                lerp(white, [33.0, 102.0, 172.0], -t)
            } else {
                lerp(white, [178.0, 24.0, 43.0], t)
            }
        }
    };
    format!(
        "#{:02x}{:02x}{:02x}",
        rgb[0].round() as u8,
        rgb[1].round() as u8,
        rgb[2].round() as u8
    )
}

/// The widest a picture grows to fit its title on one line (pixels).
const TITLE_WIDTH: f64 = 900.0;

/// The width of `text` in the 14-pixel title font, estimated: 7.6 pixels a character, 14 for
/// the wide characters of Hangul, CJK and the like.
fn title_px(text: &str) -> f64 {
    text.chars()
        .map(|c| if c as u32 >= 0x1100 { 14.0 } else { 7.6 })
        .sum()
}

/// `title` in lines of at most `width` pixels ([`title_px`]), broken at spaces (inside a word
/// longer than a line).
fn wrap_title(title: &str, width: f64) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in title.split(' ') {
        let line = lines.last_mut().expect("one line at least");
        let joined = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if title_px(&joined) <= width || line.is_empty() && title_px(word) <= width {
            *line = joined;
            continue;
        }
        if !line.is_empty() {
            lines.push(String::new());
        }
        // A word wider than a line is cut.
        for c in word.chars() {
            let line = lines.last_mut().expect("one line at least");
            if !line.is_empty() && title_px(line) + title_px(&c.to_string()) > width {
                lines.push(String::new());
            }
            lines.last_mut().expect("one line at least").push(c);
        }
    }
    lines
}

/// The heatmap as an SVG document. Every cell has a `<title>` (its row, column and value)
/// that a browser shows on hover. Cells are square; for large matrices (more than 60 rows or
/// columns) they shrink and only every n-th label is drawn.
pub fn heatmap_svg(h: &Heatmap) -> String {
    let (nr, nc) = (h.rows.len(), h.cols.len());
    let big = nr.max(nc) > 60;
    let cell = if big {
        (900.0 / nr.max(nc) as f64).clamp(3.0, 12.0)
    } else {
        28.0
    };
    let every = |n: usize| if big { n.div_ceil(20).max(1) } else { 1 };
    let longest = |v: &[String]| v.iter().map(|s| s.chars().count()).max().unwrap_or(1);
    let label_px = 7.5;
    let left = 40.0 + label_px * longest(&h.rows).min(24) as f64;
    let (gw, gh) = (cell * nc as f64, cell * nr as f64);
    // The picture is as wide as its title up to TITLE_WIDTH; a longer title is wrapped.
    let width = (left + gw + 110.0).max((20.0 + title_px(&h.title)).min(TITLE_WIDTH));
    let title = wrap_title(&h.title, width - 20.0);
    let below_title = 18.0 * (title.len() - 1) as f64;
    let top = below_title + 50.0 + label_px * 0.8 * longest(&h.cols).min(24) as f64;
    let height = top + gh + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>"
    );
    for (k, line) in title.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"10.0\" y=\"{:.0}\" font-size=\"14\">{}</text>",
            18.0 + 18.0 * k as f64,
            escape(line)
        );
    }
    // Column labels, rotated, above the grid; the axis title above them.
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.0}\" font-style=\"italic\">{}</text>",
        left,
        36.0 + below_title,
        escape(&h.col_axis)
    );
    for (j, c) in h.cols.iter().enumerate() {
        if j % every(nc) != 0 {
            continue;
        }
        let x = left + cell * (j as f64 + 0.5);
        let y = top - 6.0;
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" transform=\"rotate(-60 {x:.1} {y:.1})\">{}</text>",
            escape(c)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"{:.1}\" font-style=\"italic\" transform=\"rotate(-90 10 {:.1})\" \
         text-anchor=\"end\">{}</text>",
        top + 4.0,
        top + 4.0,
        escape(&h.row_axis)
    );
    for (i, r) in h.rows.iter().enumerate() {
        if i % every(nr) != 0 {
            continue;
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left - 6.0,
            top + cell * (i as f64 + 0.5) + 4.0,
            escape(r)
        );
    }
    for (i, row) in h.values.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let _ = writeln!(
                s,
                "<rect class=\"cell\" x=\"{:.1}\" y=\"{:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" \
                 fill=\"{}\"><title>{} / {}: {v:.3}</title></rect>",
                left + cell * j as f64,
                top + cell * i as f64,
                colour(v, h.scale),
                escape(h.rows.get(i).map_or("", |s| s.as_str())),
                escape(h.cols.get(j).map_or("", |s| s.as_str())),
            );
        }
    }
    let _ = writeln!(
        s,
        "<rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{gw:.1}\" height=\"{gh:.1}\" fill=\"none\" \
         stroke=\"#888\"/>"
    );
    // The colour bar.
    let (bx, bh) = (left + gw + 30.0, gh.clamp(80.0, 240.0));
    let (lo, hi) = match h.scale {
        Scale::Unit => (0.0f32, 1.0f32),
        Scale::Signed => (-1.0, 1.0),
    };
    let steps = 32;
    for k in 0..steps {
        let v = hi - (hi - lo) * (k as f32 + 0.5) / steps as f32;
        let _ = writeln!(
            s,
            "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"14\" height=\"{:.2}\" fill=\"{}\"/>",
            top + bh * k as f64 / steps as f64,
            bh / steps as f64 + 0.3,
            colour(v, h.scale)
        );
    }
    for (k, v) in [hi, (hi + lo) / 2.0, lo].iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\">{v}</text>",
            bx + 20.0,
            top + bh * k as f64 / 2.0 + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One map out of `[layer][head][query][key]` maps: `layer` and `head` count from 1; no
/// layer means the last, no head the average of the layer's heads. Returns the map and a
/// description ("layer 3, average of 8 heads"), or an error that says what exists.
pub fn select_map(
    maps: &[Vec<Vec<Vec<f32>>>],
    layer: Option<usize>,
    head: Option<usize>,
) -> Result<(Vec<Vec<f32>>, String), String> {
    let layers = maps.len();
    let l = layer.unwrap_or(layers);
    if l == 0 || l > layers {
        return Err(format!(
            "layer {l}: this model has {layers} layer(s) with attention, numbered from 1"
        ));
    }
    let heads = &maps[l - 1];
    match head {
        Some(h) if h == 0 || h > heads.len() => Err(format!(
            "head {h}: this model has {} head(s) per layer, numbered from 1",
            heads.len()
        )),
        Some(h) => Ok((heads[h - 1].clone(), format!("layer {l}, head {h}"))),
        None => {
            let n = heads.len() as f32;
            let avg = (0..heads[0].len())
                .map(|i| {
                    (0..heads[0][i].len())
                        .map(|j| heads.iter().map(|m| m[i][j]).sum::<f32>() / n)
                        .collect()
                })
                .collect();
            Ok((avg, format!("layer {l}, average of {} heads", heads.len())))
        }
    }
}

/// Every attention of one translation, for [`attention_html`]: `[layer][head][query][key]`.
#[derive(Debug, Clone, Default)]
pub struct AttentionSet {
    /// The source sentence as given.
    pub source: String,
    /// The translation.
    pub translation: String,
    /// The source tokens (with the end-of-sentence token the model reads).
    pub src_tokens: Vec<String>,
    /// The target tokens the decoder read (`<bos>`, then the translation's tokens).
    pub tgt_in_tokens: Vec<String>,
    /// The target tokens it predicted (the translation's tokens, then `<eos>`).
    pub tgt_out_tokens: Vec<String>,
    /// Encoder self-attention, `[layer][head][S][S]` (empty for a recurrent model).
    pub encoder: Vec<Vec<Vec<Vec<f32>>>>,
    /// Decoder self-attention, `[layer][head][T][T]` (empty for a recurrent model).
    pub decoder: Vec<Vec<Vec<Vec<f32>>>>,
    /// Encoder-decoder attention, `[layer][head][T][S]` (a recurrent model: one layer, one
    /// head).
    pub cross: Vec<Vec<Vec<Vec<f32>>>>,
    /// The model's name (shown on the page).
    pub model: String,
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            // `<` escaped so that no `</script>` can end the script early.
            '<' => out.push_str("\\u003c"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_strs(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(",")
    )
}

/// Attention maps (layer, head, row, column) as nested JSON arrays, each weight rounded to 4
/// decimals (a weight that is not finite as 0).
fn json_maps(m: &[Vec<Vec<Vec<f32>>>]) -> String {
    let mut s = String::new();
    json_list(&mut s, m, |s, layer| {
        json_list(s, layer, |s, head| {
            json_list(s, head, |s, row| {
                json_list(s, row, |s, v| {
                    let v = if v.is_finite() { *v } else { 0.0 };
                    let _ = write!(s, "{}", (v * 1e4).round() / 1e4);
                })
            })
        })
    });
    s
}

/// Appends `items` to `s` as a JSON array, each written by `item`.
fn json_list<T>(s: &mut String, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    s.push('[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        item(s, x);
    }
    s.push(']');
}

/// One self-contained HTML page (no network, no external script) to explore `set`: choose
/// the attention (encoder self-attention, decoder self-attention, encoder-decoder), the layer
/// and the head (or the average of the heads); hovering a token highlights what it attends
/// to.
pub fn attention_html(set: &AttentionSet) -> String {
    let data = format!(
        "{{\"model\":{},\"source\":{},\"translation\":{},\"src\":{},\"tgtIn\":{},\"tgtOut\":{},\
         \"encoder\":{},\"decoder\":{},\"cross\":{}}}",
        json_str(&set.model),
        json_str(&set.source),
        json_str(&set.translation),
        json_strs(&set.src_tokens),
        json_strs(&set.tgt_in_tokens),
        json_strs(&set.tgt_out_tokens),
        json_maps(&set.encoder),
        json_maps(&set.decoder),
        json_maps(&set.cross),
    );
    HTML_TEMPLATE.replace("/*DATA*/null", &data)
}

const HTML_TEMPLATE: &str = r##"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Attention explorer</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; }
.controls { margin: 0.8em 0; display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; }
table.map { border-collapse: collapse; margin-top: 0.5em; }
table.map td { width: 30px; height: 30px; border: 1px solid #eee; padding: 0; }
table.map th { font-weight: normal; font-size: 13px; padding: 2px 6px; white-space: nowrap; }
table.map th.col { height: 90px; vertical-align: bottom; }
table.map th.col span { display: inline-block; transform: rotate(-60deg); transform-origin: left bottom; width: 30px; white-space: nowrap; }
table.map th.row { text-align: right; }
th.hot { background: #ffe08a; }
td.dim { opacity: 0.25; }
#sentence { margin: 0.3em 0; }
#note { color: #666; font-size: 0.9em; }
</style>
</head>
<body>
<h1>Attention explorer</h1>
<div id="sentence"></div>
<div class="controls">
  <label>Attention <select id="kind"></select></label>
  <label>Layer <select id="layer"></select></label>
  <label>Head <select id="head"></select></label>
</div>
<div id="note"></div>
<table class="map" id="map"></table>
<script>
"use strict";
const DATA = /*DATA*/null;
const KINDS = [
  ["cross", "encoder-decoder (target word -> source words)", "tgtOut", "src"],
  ["encoder", "encoder self-attention (source -> source)", "src", "src"],
  ["decoder", "decoder self-attention (target -> earlier target)", "tgtOut", "tgtIn"],
];
const kindSel = document.getElementById("kind");
const layerSel = document.getElementById("layer");
const headSel = document.getElementById("head");
const table = document.getElementById("map");

function text(el, s) { el.textContent = s; return el; }
function option(sel, value, label) {
  const o = document.createElement("option"); o.value = value; text(o, label); sel.appendChild(o);
}
function colour(v) {
  const t = Math.max(0, Math.min(1, v));
  const a = t < 0.5 ? [255, 255, 255] : [107, 174, 214];
  const b = t < 0.5 ? [107, 174, 214] : [8, 48, 107];
  const u = t < 0.5 ? t * 2 : (t - 0.5) * 2;
  const c = a.map((x, i) => Math.round(x + (b[i] - x) * u));
  return "rgb(" + c.join(",") + ")";
}
function matrix() {
  const maps = DATA[kindSel.value];
  const layer = maps[Number(layerSel.value)];
  if (headSel.value !== "avg") return layer[Number(headSel.value)];
  const n = layer.length;
  return layer[0].map((row, i) => row.map((_, j) => layer.reduce((s, h) => s + h[i][j], 0) / n));
}
function fillLayers() {
  const maps = DATA[kindSel.value];
  layerSel.innerHTML = ""; headSel.innerHTML = "";
  maps.forEach((_, l) => option(layerSel, l, String(l + 1)));
  layerSel.value = String(maps.length - 1);
  option(headSel, "avg", "average of heads");
  maps[0].forEach((_, h) => option(headSel, h, String(h + 1)));
}
function draw() {
  const kind = KINDS.find(k => k[0] === kindSel.value);
  const rows = DATA[kind[2]], cols = DATA[kind[3]];
  const m = matrix();
  table.innerHTML = "";
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  cols.forEach(c => {
    const th = document.createElement("th"); th.className = "col";
    th.appendChild(text(document.createElement("span"), c)); head.appendChild(th);
  });
  m.forEach((row, i) => {
    const tr = table.insertRow();
    const th = text(document.createElement("th"), rows[i]); th.className = "row"; tr.appendChild(th);
    row.forEach((v, j) => {
      const td = tr.insertCell();
      td.style.background = colour(v);
      td.title = rows[i] + " -> " + cols[j] + ": " + v.toFixed(3);
      td.dataset.row = i; td.dataset.col = j;
    });
    th.addEventListener("mouseenter", () => highlight(i, row));
    th.addEventListener("mouseleave", () => highlight(-1, null));
  });
  text(document.getElementById("note"), kind[1] + ", layer " + (Number(layerSel.value) + 1) +
    ", " + (headSel.value === "avg" ? "heads averaged" : "head " + (Number(headSel.value) + 1)) +
    ". Hover a row's token to see what it attends to.");
}
function highlight(i, row) {
  const heads = table.rows[0].cells;
  for (let r = 1; r < table.rows.length; r++) {
    const cells = table.rows[r].cells;
    cells[0].classList.toggle("hot", r - 1 === i);
    for (let c = 1; c < cells.length; c++) cells[c].classList.toggle("dim", i >= 0 && r - 1 !== i);
  }
  for (let c = 1; c < heads.length; c++) {
    heads[c].classList.toggle("hot", row !== null && row[c - 1] >= Math.max(...row) * 0.5);
  }
}
text(document.getElementById("sentence"), DATA.model + ": \u201c" + DATA.source + "\u201d" +
  (DATA.translation ? " \u2192 \u201c" + DATA.translation + "\u201d" : ""));
// A language model has only its (causal) self-attention.
if (DATA.cross.length === 0) KINDS[1][1] = "causal self-attention (word -> earlier words)";
KINDS.forEach(k => { if (DATA[k[0]].length > 0) option(kindSel, k[0], k[1]); });
kindSel.addEventListener("change", () => { fillLayers(); draw(); });
layerSel.addEventListener("change", draw);
headSel.addEventListener("change", draw);
fillLayers();
draw();
</script>
</body>
</html>
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heatmap_has_a_cell_per_value_escaped_labels_and_a_colour_bar() {
        let h = Heatmap {
            title: "a <b> & c".into(),
            rows: vec!["x".into(), "<eos>".into()],
            cols: vec!["\"q\"".into(), "r".into(), "s".into()],
            values: vec![vec![0.0, 0.5, 1.0], vec![0.2, 0.3, 0.5]],
            scale: Scale::Unit,
            row_axis: "target".into(),
            col_axis: "source".into(),
        };
        let svg = heatmap_svg(&h);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("class=\"cell\"").count(), 6);
        assert!(svg.contains("&lt;eos&gt;") && svg.contains("&quot;q&quot;"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("<eos>"));
        // 0 is white, 1 the darkest blue.
        assert_eq!(colour(0.0, Scale::Unit), "#ffffff");
        assert_eq!(colour(1.0, Scale::Unit), "#08306b");
        assert_eq!(colour(0.0, Scale::Signed), "#ffffff");
        assert_ne!(colour(-1.0, Scale::Signed), colour(1.0, Scale::Signed));
    }

    #[test]
    fn a_long_title_is_wrapped_inside_the_picture() {
        let title = format!(
            "encoder-decoder attention, layer 3, heads averaged: \u{201c}{}\u{201d} \u{2192} \u{201c}{}\u{201d}",
            "남자가 공원에서 자전거를 탄다 ".repeat(6),
            "a man rides a bike in the park ".repeat(4)
        );
        let h = Heatmap {
            title: title.clone(),
            rows: vec!["a".into(), "<eos>".into()],
            cols: vec!["x".into(), "<eos>".into()],
            values: vec![vec![0.5, 0.5], vec![0.2, 0.8]],
            scale: Scale::Unit,
            row_axis: "target".into(),
            col_axis: "source".into(),
        };
        let svg = heatmap_svg(&h);
        let width: f64 = svg
            .split("width=\"")
            .nth(1)
            .and_then(|w| w.split('"').next())
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert!(width <= TITLE_WIDTH, "{width}");
        let lines: Vec<&str> = svg
            .lines()
            .filter(|l| l.contains("font-size=\"14\""))
            .collect();
        assert!(lines.len() >= 3, "{svg}");
        for l in &lines {
            let text = l.split('>').nth(1).unwrap().split('<').next().unwrap();
            assert!(10.0 + title_px(text) <= width, "past the edge: {text}");
        }
        // Nothing of the title is lost.
        let shown: String = lines
            .iter()
            .map(|l| l.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            shown.split_whitespace().collect::<Vec<_>>(),
            escape(&title).split_whitespace().collect::<Vec<_>>()
        );
        // A short title stays one line.
        let one = heatmap_svg(&Heatmap {
            title: "short".into(),
            ..h
        });
        assert_eq!(one.matches("font-size=\"14\"").count(), 1);
    }

    #[test]
    fn html_page_is_self_contained_and_cannot_be_closed_by_its_data() {
        let set = AttentionSet {
            source: "ein </script> mann".into(),
            translation: "a \"man\"".into(),
            src_tokens: vec!["ein".into(), "</script>".into(), "<eos>".into()],
            tgt_in_tokens: vec!["<bos>".into(), "a".into()],
            tgt_out_tokens: vec!["a".into(), "<eos>".into()],
            cross: vec![vec![vec![vec![0.5, 0.25, 0.25], vec![0.1, 0.1, 0.8]]]],
            model: "gru-bahdanau".into(),
            ..Default::default()
        };
        let html = attention_html(&set);
        assert_eq!(html.matches("</script>").count(), 1, "only the page's own");
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(!html.contains("/*DATA*/"));
        assert!(html.contains("\"cross\":[[[[0.5,0.25,0.25],[0.1,0.1,0.8]]]]"));
    }
}
