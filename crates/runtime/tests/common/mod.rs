//! What the published-model tests share: decoding a loaded run's sources and reading its
//! hypotheses back as token strings.

#![allow(dead_code)] // each test file uses its part

use candle_core::Device;
use serde_json::Value;
use std::path::Path;
use transformer_decode::{DecodeOptions, Hypothesis, SearchRules};
use transformer_model::DecodePrecision;
use transformer_runtime::import::Format;
use transformer_runtime::load::{load_run, Execution, LoadedMt};
use transformer_runtime::translate::{translate, DecodeRequest};
use transformer_text::TextTokenizer;

/// Imports `model` (a published model: a CTranslate2 directory, say) into a temporary run
/// and loads it to decode in `decoding` (`None`: the model's own arithmetic).
pub fn imported(model: &Path, decoding: Option<DecodePrecision>) -> LoadedMt {
    let run = std::env::temp_dir().join(format!(
        "transformer-published-test-{}-{}",
        std::process::id(),
        model.to_string_lossy().replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&run);
    let imported = Format::detect(model)
        .and_then(|f| f.read(model))
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    imported.write_run(&run).expect("write the run");
    let how = Execution {
        decoding,
        ..Execution::on(&Device::Cpu)
    };
    let loaded = load_run(&run, &how).expect("load the imported run");
    let _ = std::fs::remove_dir_all(&run);
    loaded
}

/// A fixture run's `translate_batch` options as decoding options (CTranslate2's defaults
/// where unset), and its length penalty.
pub fn options(run: &LoadedMt, o: &Value) -> (DecodeOptions, f64) {
    let beam = o["beam_size"].as_u64().unwrap_or(2) as usize;
    let lp = o["length_penalty"].as_f64().unwrap_or(1.0);
    let opts = DecodeOptions {
        length_penalty: lp,
        max_len_b: o["max_decoding_length"].as_u64().unwrap_or(256) as usize,
        want_attention: o["replace_unknowns"].as_bool().unwrap_or(false),
        rules: SearchRules::CTranslate2 {
            min_length: o["min_decoding_length"].as_u64().unwrap_or(1) as usize,
            num_hypotheses: o["num_hypotheses"].as_u64().unwrap_or(1) as usize,
        },
        ..run.config.decode_options(beam)
    };
    (opts, lp)
}

/// Each source's n-best list, decoded by `run` on the CPU under `opts`.
pub fn decode(run: &LoadedMt, src: &[Vec<u32>], opts: DecodeOptions) -> Vec<Vec<Hypothesis>> {
    let decoder = run.model.decoder().expect("a decoder");
    translate(
        &decoder,
        src,
        &DecodeRequest::new(opts),
        &Device::Cpu,
        |_, _| {},
    )
    .expect("decoding")
}

/// `h`'s tokens as the run's target vocabulary spells them.
pub fn token_strings(run: &LoadedMt, h: &Hypothesis) -> Vec<String> {
    h.tokens.iter().map(|&t| run.tokenizer.token(t)).collect()
}
