//! What the published-model tests share: decoding a loaded run's sources and reading its
//! hypotheses back as token strings.

use candle_core::Device;
use transformer_decode::{DecodeOptions, Hypothesis};
use transformer_runtime::load::LoadedMt;
use transformer_runtime::translate::{translate, DecodeRequest};
use transformer_text::TextTokenizer;

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
